"""Two source trees of this package in one run, interleaved: the one harness for every "before vs after" figure.

    python benchmarks/tree_ab.py --trees OLD_CHECKOUT . --model .pytest-assets/full --case chat --sizes 1,8,32
    python benchmarks/tree_ab.py --trees OLD_CHECKOUT . --model .pytest-assets/full --case gpt --sizes 1,16,64
    python benchmarks/tree_ab.py ... --case gpt --noamx --out /tmp/invariance_ab_noamx.json

Cases (each measurement is a fresh process with its tree first on sys.path, 2 threads):
- `chat`: `Chat.infer` through the public API (refine off, one seeded text per size, forced to --steps code steps,
  Decoder + Vocos included), best of 2 calls: code steps per second end to end.
- `gpt`: the velocity GPT alone (`load_pretrained(is_vllm=True)`, N seeded requests forced to --steps, prefill
  included), best of 2 `generate` calls: code steps per second.
Trees alternate pair by pair so a noisy host hits both alike; the ratio new / old is the median of the per-pair
ratios. Writes --out (default: a temporary file, printed) as {"trees", "case", "steps", "noamx", "results":
{dtype: {size: {"old", "new", "ratio_new_over_old"}}}} (the shape docs tables read).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PRELUDE = r"""
import sys, time, json
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(2)
model, dtype, sizes, steps = sys.argv[2], sys.argv[3], [int(s) for s in sys.argv[4].split(",")], int(sys.argv[5])
if sys.argv[6] == "noamx":  # every tree looks kernels.amx_ready up at call time: the route of CPUs without AMX
    from chattts_velocity.model import kernels
    kernels.amx_ready = lambda: False
def best_of_two(run):
    run(2)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        run(None)
        times.append(time.perf_counter() - start)
    return min(times)
"""

CASES = {
    "chat": PRELUDE + r"""
from chattts_velocity import Chat, InferCodeParams
chat = Chat()
chat.load(source="custom", custom_path=model, verify=False, use_vllm=True, dtype=dtype)
out = {}
for n in sizes:
    texts = [f"Sentence number {i} is read aloud by the engine." for i in range(n)]
    params = InferCodeParams(max_new_token=steps, min_new_token=steps, manual_seed=1, show_tqdm=False)
    def run(limit):
        chat.infer(texts[:limit] if limit else texts, skip_refine_text=True, params_infer_code=params,
                   split_text=False)
    out[n] = n * steps / best_of_two(run)
print(json.dumps(out))
""",
    "gpt": PRELUDE + r"""
from chattts_velocity import load_pretrained, InferCodeParams
from chattts_velocity.schema import Prompt
llm = load_pretrained(model, is_vllm=True, dtype=dtype)
out = {}
for n in sizes:
    prompts = [Prompt(torch.full((20, 4), 100 + i), torch.ones(20, dtype=torch.bool)) for i in range(n)]
    params = [InferCodeParams(manual_seed=i, max_new_token=steps, min_new_token=steps).to_sampling_params(
        "code", 625, True) for i in range(n)]
    def run(limit):
        llm.generate(prompts[:limit] if limit else prompts, params[:limit] if limit else params, progress=False)
    out[n] = n * steps / best_of_two(run)
print(json.dumps(out))
""",
}


def measure(case: str, tree: str, args: argparse.Namespace, dtype: str) -> dict[str, float]:
    """One fresh process of `tree` -> {size: code steps per second}."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"} if args.noamx else dict(os.environ)
    env.pop("PYTHONPATH", None)  # the child puts its tree first on sys.path itself
    done = subprocess.run([sys.executable, "-c", CASES[case], str(Path(tree).resolve()), args.model, dtype,
                           args.sizes, str(args.steps), "noamx" if args.noamx else "amx"],
                          capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode:
        raise SystemExit(f"error: the {case} case failed in {tree}:\n{done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def compare(old: list[dict[str, float]], new: list[dict[str, float]]) -> dict[str, dict]:
    return {size: {"old": [r[size] for r in old], "new": [r[size] for r in new],
                   "ratio_new_over_old": statistics.median(b[size] / a[size] for a, b in zip(old, new, strict=True))}
            for size in old[0]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs=2, required=True, metavar=("OLD", "NEW"), help="two checkouts of this repo")
    parser.add_argument("--model", required=True, help="asset folder (random full-size weights are fine)")
    parser.add_argument("--case", choices=sorted(CASES), default="chat", help="what to time (see above)")
    parser.add_argument("--dtypes", default="bfloat16", help="comma-separated engine dtypes (default bfloat16)")
    parser.add_argument("--sizes", default="1,8,32", help="texts (chat) or requests (gpt) per call")
    parser.add_argument("--steps", type=int, default=64, help="forced code steps per request (default 64)")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved old/new pairs (default 3)")
    parser.add_argument("--noamx", action="store_true", help="both trees take the route of CPUs without AMX")
    parser.add_argument("--out", help="JSON to write (default: a file in the temporary folder)")
    args = parser.parse_args(argv)
    results = {}
    for dtype in args.dtypes.split(","):
        runs: dict[str, list[dict[str, float]]] = {tree: [] for tree in args.trees}
        for _ in range(args.pairs):
            for tree in args.trees:
                runs[tree].append(measure(args.case, tree, args, dtype))
                print(dtype, tree, runs[tree][-1], flush=True)
        results[dtype] = compare(*(runs[t] for t in args.trees))
    report = {"trees": args.trees, "case": args.case, "steps": args.steps, "noamx": args.noamx, "results": results}
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tree_ab_")) / "tree_ab.json"
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps(results, indent=1), f"\nwritten: {out}", sep="")
    return report


if __name__ == "__main__":
    main()
