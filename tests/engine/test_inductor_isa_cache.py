"""Compiled decode graphs stay correct when processes that emulate another vector ISA (ATEN_CPU_CAPABILITY, as the
AVX2-only benchmarks set it) share inductor's on-disk cache. Inductor does not key that cache on the variable, so the
compiled backend names the vector width itself (kernels.inductor_simdlen); without it, a graph generated for AVX2 and
reused where its kernels compile for AVX-512 overruns its buffers (glibc aborts), and the converse returns unwritten
values. The last test shows the remedy on a graph of torch alone (the rope's rotate-half), without the engine."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chattts_velocity.model import kernels


def _vector_widths() -> set[int]:
    from torch._inductor import cpu_vec_isa

    return {isa.bit_width() for isa in cpu_vec_isa.valid_vec_isa_list()}


needs_both_widths = pytest.mark.skipif(not {256, 512} <= _vector_widths(),
                                       reason="needs a CPU with both AVX2 and AVX-512 vector ISAs")
ROTATE_HALF = """
import sys, torch
from chattts_velocity.model import kernels
def rotate_half(x):
    return torch.cat([-x[..., 16:], x[..., :16]], dim=-1).float() * 2.0
x = torch.randn(3, 4, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
got = torch.compile(rotate_half, dynamic=False, options={"cpp.simdlen": kernels.inductor_simdlen()})(x)
sys.exit(0 if torch.equal(got, rotate_half(x)) else 1)
"""
COMPILED_DECODE = (f"{Path(__file__).parent / 'test_backends.py'}"
                   "::test_decode_equals_the_eager_torch_path[bfloat16-compiled-lens0]")


@needs_both_widths
@pytest.mark.parametrize("capability,width", [("avx2", 256), ("avx512", 512)])
def test_simdlen_names_the_width_aten_cpu_capability_selects(monkeypatch, capability: str, width: int) -> None:
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
    assert kernels.inductor_simdlen() == width


@pytest.mark.slow
@needs_both_widths
@pytest.mark.parametrize("first,second", [("avx2", "avx512"), ("avx512", "avx2")])
def test_compiled_decode_survives_a_cache_shared_across_capabilities(tmp_path, first: str, second: str) -> None:
    """The AVX2 kernel library attends inside the graph (CHATTTS_VELOCITY_CPU_KERNELS=avx2) in both processes."""
    for capability in (first, second):
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "ATEN_CPU_CAPABILITY": capability,
               kernels.ENV_SWITCH: "avx2"}
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:logging",
                   "-m", "slow or not slow", COMPILED_DECODE]  # the case is in the slow suite: select it by id
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"ATEN_CPU_CAPABILITY={capability}: rc {done.returncode}\n{done.stdout[-3000:]}"


@pytest.mark.slow
@needs_both_widths
@pytest.mark.parametrize("first,second", [("avx2", "avx512"), ("avx512", "avx2")])
def test_a_torch_graph_compiled_with_simdlen_survives_a_shared_cache(tmp_path, first: str, second: str) -> None:
    """bf16 [3, 4, 32] -> fp32 rotate-half: without cpp.simdlen the second process reuses the first one's graph,
    generated for the other vector width (glibc aborts, or half of each output is unwritten)."""
    for capability in (first, second):
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "ATEN_CPU_CAPABILITY": capability}
        done = subprocess.run([sys.executable, "-c", ROTATE_HALF], env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, f"ATEN_CPU_CAPABILITY={capability}: rc {done.returncode}\n{done.stderr[-3000:]}"
