"""Micro-benchmark: the C++ decode kernels against the torch paths they replace, interleaved in one process.

Linears: the 80 projections of one full-size step (20 layers x q/k/v, o, gate/up, down; distinct weights, so every
call reads DRAM like a real step) at M rows: oneDNN's prepacked bf16 GEMM, our bf16 tiles, our AMX panels (CPUs
with AMX-BF16), our int8 tiles and int8 AMX panels.
Attention: 20 layers of paged decode attention over bf16 caches: our kernel against torch.compile's fused gather.
Usage: python -m benchmarks.bench_kernels [--threads 2] [--repeats 6] [--rows 1,4,16] [--name kernels]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.lib.ab import by_name, interleaved
from chattts_velocity.model import DecodeMetadata, kernels
from chattts_velocity.model.attention import paged_decode_attention
from chattts_velocity.model.packed import _quantize_int8

REPO = Path(__file__).resolve().parents[1]

SHAPES = [(2304, 768), (768, 768), (6144, 768), (768, 3072)]  # fused q/k/v, o, fused gate/up, down
LAYERS, HEADS, HEAD_DIM, BLOCK = 20, 12, 64, 16


def timed(variants: dict[str, Callable[[], object]], repeats: int) -> dict[str, dict[str, float]]:
    """Best and median milliseconds per variant, the variants interleaved in every repeat."""
    def measure(name: str) -> float:
        start = time.perf_counter()
        variants[name]()
        return (time.perf_counter() - start) * 1e3

    times = by_name(list(variants), interleaved(list(variants), repeats, measure, warm_up=True))
    return {name: {"best_ms": min(t), "median_ms": statistics.median(t)} for name, t in times.items()}


def linear_variants(rows: int) -> tuple[dict[str, Callable[[], object]], float]:
    ops = kernels.ops()
    weights = [[torch.randn(n, k) * 0.02 for n, k in SHAPES] for _ in range(LAYERS)]
    bf16 = [[w.bfloat16() for w in layer] for layer in weights]
    onednn = [[torch.ops.mkldnn._reorder_linear_weight(w) for w in layer] for layer in bf16]
    tiles = [[kernels.to_tiles(w, 32) for w in layer] for layer in bf16]
    panels = [[kernels.to_panels(w) for w in layer] for layer in bf16] if kernels.amx_ready() else []
    quantized = [[_quantize_int8(w) for w in layer] for layer in weights]
    int8 = [[(kernels.to_tiles(q, 16), s) for q, s in layer] for layer in quantized]
    int8_panels = [[(kernels.to_panels(q), s) for q, s in layer] for layer in quantized] if panels else []
    x = {k: torch.randn(rows, k) for k in (768, 3072)}
    xb = {k: v.bfloat16() for k, v in x.items()}
    ks = [k for _, k in SHAPES]
    variants = {
        "onednn bf16": lambda: [torch.ops.mkldnn._linear_pointwise(xb[k], w, None, "none", [], "")
                                for layer in onednn for w, k in zip(layer, ks, strict=True)],
        "tiles bf16": lambda: [ops.linear_bf16(xb[k], w) for layer in tiles for w, k in zip(layer, ks, strict=True)],
        "tiles int8": lambda: [ops.linear_int8(xb[k], w, s)
                               for layer in int8 for (w, s), k in zip(layer, ks, strict=True)],
    }
    if panels:  # the AMX panel layout (kernels.to_panels) at every row count
        variants["amx bf16"] = lambda: [ops.linear_bf16(xb[k], p) for lp in panels for p, k in zip(lp, ks, strict=True)]
        variants["amx int8"] = lambda: [ops.linear_int8(xb[k], p, s) for lp in int8_panels
                                        for (p, s), k in zip(lp, ks, strict=True)]
    return variants, sum(n * k for n, k in SHAPES) * LAYERS * 2 / 1e9  # GB of bf16 weights


def attention_variants(batch: int, context: int) -> tuple[dict[str, Callable[[], object]], float]:
    per_seq = -(-context // BLOCK)
    blocks = batch * per_seq + 1
    shape = (blocks, BLOCK, HEADS, HEAD_DIM)
    caches = [(torch.randn(shape).bfloat16(), torch.randn(shape).bfloat16()) for _ in range(LAYERS)]
    tables = torch.randperm(blocks - 1)[: batch * per_seq].view(batch, per_seq)
    lens = torch.full((batch,), context)
    q = torch.randn(batch, HEADS, HEAD_DIM).bfloat16()
    meta = DecodeMetadata(torch.zeros(batch, dtype=torch.long), tables, lens)
    compiled = torch.compile(paged_decode_attention, dynamic=False)
    kernel = kernels.ops().paged_decode_attention
    variants = {
        "kernel": lambda: [kernel(q, k, v, tables, lens, HEAD_DIM**-0.5) for k, v in caches],
        "compiled torch": lambda: [compiled(q, k, v, meta) for k, v in caches],
    }
    return variants, batch * context * HEADS * HEAD_DIM * 2 * 2 * LAYERS / 1e9  # GB of K and V read


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--name", default="kernels")
    parser.add_argument("--rows", type=lambda v: [int(r) for r in v.split(",")], default=[1, 4, 8, 16, 32, 64],
                        help="batch sizes of the linears (default 1,4,8,16,32,64)")
    args = parser.parse_args(argv)
    if not kernels.load():
        raise SystemExit("error: the C++ kernels are unavailable here (see the warning above)")
    if args.threads:
        torch.set_num_threads(args.threads)
    report: dict = {"threads": torch.get_num_threads(), "linears": {}, "attention": {}}
    with torch.inference_mode():
        for rows in args.rows:
            variants, gigabytes = linear_variants(rows)
            report["linears"][f"M={rows}"] = _print(f"80 linears, M={rows}", timed(variants, args.repeats), gigabytes)
        for batch, context in ((1, 100), (32, 100), (32, 300)):
            variants, gigabytes = attention_variants(batch, context)
            report["attention"][f"B={batch} context={context}"] = _print(
                f"attention x 20 layers, B={batch}, context {context}", timed(variants, args.repeats), gigabytes)
    path = REPO / "benchmarks" / "results" / f"{args.name}.json"
    path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"results written to {path}")


def _print(title: str, results: dict[str, dict[str, float]], gigabytes: float) -> dict:
    print(title)
    for name, r in results.items():
        r["gb_per_s_best"] = gigabytes / r["best_ms"] * 1e3
        print(f"  {name:<16} best {r['best_ms']:7.1f} ms  median {r['median_ms']:7.1f} ms"
              f"  ({r['gb_per_s_best']:.1f} GB/s)")
    return results


if __name__ == "__main__":
    main()
