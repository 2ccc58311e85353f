"""A/B of the AVX-512 tile and AMX panel linears: another checkout's kernels (its library defines
torch.ops.chattts_velocity_cpu) against this tree's (chattts_velocity_avx512), loaded side by side in one process,
1 thread, CPU time, interleaved, best of 7, 10 layers' projections at 1 / 16 / 64 rows; also whether both give the
same bits.

    python benchmarks/bench_kernels_ab.py <checkout before the per-ISA layout>   # writes results/kernels_ab.json
"""
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OLD_TREE = Path(sys.argv[1])
spec = importlib.util.spec_from_file_location("old_kernels", OLD_TREE / "chattts_velocity/model/kernels/__init__.py")
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
torch.ops.load_library(str(old._build()))
from chattts_velocity.model import kernels  # noqa: E402 (imported once REPO is on sys.path)
from chattts_velocity.model.packed import _quantize_int8  # noqa: E402 (imported once REPO is on sys.path)

torch.set_num_threads(1)
OLD, NEW = torch.ops.chattts_velocity_cpu, kernels.ops("avx512")
SHAPES = [(2304, 768), (768, 768), (6144, 768), (768, 3072)]
g = torch.Generator().manual_seed(0)
W = [torch.randn(n, k, generator=g) * 0.02 for _ in range(10) for n, k in SHAPES]
Q = [_quantize_int8(w) for w in W]
layouts = {
  "tiles bf16": ("linear_bf16", [(kernels.to_tiles(w.bfloat16(), 32),) for w in W]),
  "tiles int8": ("linear_int8", [(kernels.to_tiles(q, 16), s) for q, s in Q]),
  "amx bf16": ("linear_bf16", [(kernels.to_panels(w.bfloat16()),) for w in W]),
  "amx int8": ("linear_int8", [(kernels.to_panels(q), s) for q, s in Q]),
}
out: dict = {}


def kdim(w: torch.Tensor) -> int:
    """Input features of a packed weight: tiles [N/4, K/C, 4, C] or panels [N/16, K/2, 16, 2]."""
    return w.shape[1] * (2 if w.shape[2] == 16 else w.shape[3])


for M in (1, 16, 64):
    x = {k: torch.randn(M, k, generator=g).bfloat16() for k in (768, 3072)}
    variants = {}
    for name, (fn, packs) in layouts.items():
        for tree, ops in (("old", OLD), ("new", NEW)):
            f = getattr(ops, fn)
            variants[f"{name} {tree}"] = lambda f=f, packs=packs, x=x: [f(x[kdim(p[0])], *p) for p in packs]
    times = {n: [] for n in variants}
    with torch.inference_mode():
        for v in variants.values():
            v()  # warm-up
        for _ in range(7):
            for n, v in variants.items():
                t = time.process_time()
                v()
                times[n].append((time.process_time() - t) * 1e3)
    out[M] = {n: min(t) for n, t in times.items()}
    out[f"{M} identical"] = {}
    for name in layouts:
        o, nw = out[M][f"{name} old"], out[M][f"{name} new"]
        print(f"M={M:3d} {name:11s} old {o:7.2f} ms  new {nw:7.2f} ms  new/old {nw/o:.3f}", flush=True)
    # identical results?
    for name, (fn, packs) in layouts.items():
        p = packs[0]
        xx = x[kdim(p[0])]
        same = torch.equal(getattr(OLD, fn)(xx, *p), getattr(NEW, fn)(xx, *p))
        out[f"{M} identical"][name] = same
        print(f"   {name}: identical outputs old vs new: {same}")
(REPO / "benchmarks/results/kernels_ab.json").write_text(json.dumps(out, indent=1), encoding="utf-8")
