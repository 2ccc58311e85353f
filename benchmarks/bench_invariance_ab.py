"""What the batch-invariant kernels cost: GPT-only code steps/s of two source trees in one run, interleaved.

    python benchmarks/bench_invariance_ab.py --trees OLD_CHECKOUT . --model .pytest-assets/full --sizes 1,16,64
    python benchmarks/bench_invariance_ab.py ... --noamx --out benchmarks/results/invariance_ab_noamx.json

Each measurement is a fresh process (the tree first on sys.path) that loads the velocity engine in --dtype and
times the best of 2 `generate` calls of N seeded requests forced to --steps code steps (prefill included). Trees
alternate so a noisy host hits both alike; the ratio new/old is taken per pair. Writes results/invariance_ab.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import sys, time, json
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(2)
from chattts_velocity import load_pretrained, InferCodeParams
from chattts_velocity.model import kernels
from chattts_velocity.schema import Prompt
if sys.argv[6] == "noamx":  # both trees look kernels.amx_ready up at call time: the route of CPUs without AMX
    kernels.amx_ready = lambda: False
llm = load_pretrained(sys.argv[2], is_vllm=True, dtype=sys.argv[3])
steps = int(sys.argv[5])
out = {}
for n in map(int, sys.argv[4].split(",")):
    prompts = [Prompt(torch.full((20, 4), 100 + i), torch.ones(20, dtype=torch.bool)) for i in range(n)]
    params = [InferCodeParams(manual_seed=i, max_new_token=steps, min_new_token=steps).to_sampling_params(
        "code", 625, True) for i in range(n)]
    llm.generate(prompts[:2], params[:2], progress=False)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        llm.generate(prompts, params, progress=False)
        times.append(time.perf_counter() - start)
    out[n] = n * steps / min(times)
print(json.dumps(out))
"""


def _env(noamx: bool) -> dict:
    """Without AMX, oneDNN (the old tree's batch kernel) must not use it either: AVX-512 BF16 at most."""
    return {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"} if noamx else dict(os.environ)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs=2, required=True, help="old and new checkouts of this repository")
    parser.add_argument("--model", required=True, help="asset folder (random full-size weights are fine)")
    parser.add_argument("--dtypes", default="bfloat16,int8")
    parser.add_argument("--sizes", default="1,16,64")
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--noamx", action="store_true",
                        help="both trees take the route of CPUs without AMX (oneDNN too: ONEDNN_MAX_CPU_ISA)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "invariance_ab.json"))
    args = parser.parse_args(argv)
    results = {}
    for dtype in args.dtypes.split(","):
        runs = {tree: [] for tree in args.trees}
        for _ in range(args.pairs):
            for tree in args.trees:
                done = subprocess.run([sys.executable, "-c", CHILD, str(Path(tree).resolve()), args.model, dtype,
                                       args.sizes, str(args.steps), "noamx" if args.noamx else "amx"],
                                      capture_output=True, text=True, check=True, env=_env(args.noamx))
                runs[tree].append(json.loads(done.stdout.strip().splitlines()[-1]))
                print(dtype, tree, runs[tree][-1], flush=True)
        old, new = (runs[t] for t in args.trees)
        results[dtype] = {size: {"old": [r[size] for r in old], "new": [r[size] for r in new],
                                 "ratio_new_over_old": statistics.median(
                                     b[size] / a[size] for a, b in zip(old, new, strict=True))}
                          for size in old[0]}
    Path(args.out).write_text(json.dumps({"trees": args.trees, "steps": args.steps, "noamx": args.noamx,
                                          "results": results}, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
