"""Standalone reproduction (torch only) of a torch inductor defect: its on-disk FX graph cache is not keyed on
ATEN_CPU_CAPABILITY, which picks the vector ISA inductor generates C++ for.

Two processes share one fresh TORCHINDUCTOR_CACHE_DIR and compile the same graph (bf16 [3, 4, 32] -> the rope's
rotate-half in fp32). The first, under ATEN_CPU_CAPABILITY=avx2, generates loops for 8-float vectors and caches the
graph. The second, under avx512, hits that entry and compiles the same source for 16-float vectors: each
VectorizedN<float, 2> store writes 32 floats where the loop expected 16, 64 bytes past the buffer's end, and glibc
aborts ("double free or corruption (!prev)"). In the other order the AVX2 process gets the AVX-512 loops and half
of each output is never written (NaN or garbage). With --simdlen both processes pass torch.compile the vector width
they would pick anyway (cpp.simdlen, as CompiledTorchBackend does), which is part of the key: both give eager's
values.

    python benchmarks/repro_inductor_isa_cache.py [--order avx2,avx512 | avx512,avx2] [--simdlen]

Needs an x86 CPU with AVX-512 (two vector widths); about 30 s. Prints one line per process and exits 1 when any
process crashed or disagreed with eager.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([-x[..., 16:], x[..., :16]], dim=-1).float() * 2.0


def compile_and_compare(simdlen: bool) -> int:
    options = None
    if simdlen:
        from torch._inductor import cpu_vec_isa

        options = {"cpp.simdlen": cpu_vec_isa.pick_vec_isa().bit_width()}
    x = torch.randn(3, 4, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    got = torch.compile(rotate_half, dynamic=False, options=options)(x)
    equal = torch.equal(got, rotate_half(x))
    print("equal to eager" if equal else f"differs from eager (max error {(got - rotate_half(x)).abs().max()})")
    return 0 if equal else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--order", default="avx2,avx512", help="ATEN_CPU_CAPABILITY of the first, second process")
    parser.add_argument("--simdlen", action="store_true", help="pass cpp.simdlen (the workaround)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return compile_and_compare(args.simdlen)
    failed = False
    with tempfile.TemporaryDirectory() as cache:
        for capability in args.order.split(","):
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "ATEN_CPU_CAPABILITY": capability}
            command = [sys.executable, __file__, "--child", *(["--simdlen"] if args.simdlen else [])]
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
            said = (done.stdout.strip() + " " + done.stderr.strip()[-200:]).strip()
            print(f"ATEN_CPU_CAPABILITY={capability}: exit {done.returncode}: {said}")
            failed |= done.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
