"""A/B of the KV cache's dtype at long contexts: decode steps/s of 32 sequences x 300 positions, bf16 KV vs int8 KV.

Two engines over the same weights (dtype bfloat16 by default, the cpu backend's fused C++ layers) each run decode
steps of `--seqs` sequences whose context is `--context` positions long; turns of a few steps alternate between the
engines, so host noise hits both alike. Each turn feeds the same positions again (context .. context + steps - 1):
the pools' contents do not change the work, so nothing is prefilled. Full-size random weights by default.
Usage: python benchmarks/bench_kv_int8.py [--dtype bfloat16] [--seqs 32] [--context 300] [--rounds 5] [--threads 1,2]
                                         [--name kv_int8]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from chattts_velocity import load_pretrained  # noqa: E402 (imported once REPO is on sys.path)
from chattts_velocity.engine.backends.paged_kv import StepTensors  # noqa: E402 (imported once REPO is on sys.path)

STEPS_PER_TURN = 8
KV_DTYPES = ("auto", "int8")  # EngineConfig.kv_cache_dtype; "auto" is the weights' bf16


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / ".pytest-assets" / "full"))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "int8"])
    parser.add_argument("--seqs", type=int, default=32)
    parser.add_argument("--context", type=int, default=300, help="positions already in each sequence's KV cache")
    parser.add_argument("--rounds", type=int, default=5, help="turns per KV dtype (default 5)")
    parser.add_argument("--threads", type=lambda v: [int(t) for t in v.split(",")], default=[torch.get_num_threads()],
                        help="torch threads, one A/B per count (default: torch's)")
    parser.add_argument("--name", default="kv_int8", help="results/<name>.json")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    steps = {kv: _decode_turn(_engine(args, kv), args.seqs, args.context) for kv in KV_DTYPES}
    report = {"dtype": args.dtype, "seqs": args.seqs, "context": args.context, "steps_per_turn": STEPS_PER_TURN,
              "rounds": args.rounds, "threads": {}}
    for threads in args.threads:
        torch.set_num_threads(threads)
        report["threads"][str(threads)] = result = _ab(steps, args.rounds)
        median = result["ms_per_step_median"]
        print(f"{threads} thread(s), {args.seqs} x {args.context} positions, {args.dtype} weights: bf16 KV "
              f"{median['auto']:.1f} ms/step ({1e3 / median['auto']:.2f} steps/s), int8 KV {median['int8']:.1f} "
              f"ms/step ({1e3 / median['int8']:.2f} steps/s): {result['int8_speedup']:.2f}x")
    path = Path(args.out) / f"{args.name}.json"
    path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"results written to {path}")


def _ab(steps: dict, rounds: int) -> dict:
    """Turns alternating between the KV dtypes: ms per step of each turn, medians, steps/s and the speed-up."""
    for turn in steps.values():  # warm-up: first touches of the pools and the kernels' scratch
        turn()
    ms: dict[str, list[float]] = {kv: [] for kv in steps}
    for _ in range(rounds):
        for kv, turn in steps.items():
            start = time.perf_counter()
            turn()
            ms[kv].append((time.perf_counter() - start) / STEPS_PER_TURN * 1e3)
    median = {kv: statistics.median(t) for kv, t in ms.items()}
    return {"ms_per_step": ms, "ms_per_step_median": median,
            "steps_per_s_median": {kv: 1e3 / t for kv, t in median.items()},
            "int8_speedup": median["auto"] / median["int8"]}


def _engine(args: argparse.Namespace, kv_cache_dtype: str):
    try:  # the default 1 GiB pool: 1092 full-size bf16 blocks of 16 positions, 32 x 308 positions take 640
        llm = load_pretrained(args.model, is_vllm=True, dtype=args.dtype, backend="cpu", kv_cache_dtype=kv_cache_dtype)
    except ValueError as exc:  # e.g. the CPU kernels do not run here
        raise SystemExit(f"error: {exc}") from None
    return llm.engine


def _decode_turn(engine, seqs: int, context: int):
    """A function running STEPS_PER_TURN decode steps of `seqs` sequences at positions context, context + 1, ..."""
    runner, bs = engine.runner, engine.runner.block_size
    width = -(-(context + STEPS_PER_TURN) // bs)
    if seqs * width > engine.block_manager.num_blocks:
        raise SystemExit(f"error: {seqs} x {context} positions need {seqs * width} blocks, the pool has "
                         f"{engine.block_manager.num_blocks}")
    tables = [list(range(b * width, (b + 1) * width)) for b in range(seqs)]
    ids = torch.randint(0, 625, (seqs, 4), generator=torch.Generator().manual_seed(0))  # [B, 4] codes
    embeds = runner.embed.embed(ids, torch.zeros(seqs, dtype=torch.bool)).to(runner.act_dtype)

    @torch.inference_mode()
    def turn() -> None:
        for t in range(STEPS_PER_TURN):
            position = context + t
            step = StepTensors.from_lists([1] * seqs, [position + 1] * seqs,
                                          [table[: position // bs + 1] for table in tables], bs, runner.device)
            runner.backend.run(embeds, step)
    return turn


if __name__ == "__main__":
    main()
