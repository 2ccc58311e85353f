"""Two source trees of this package through the public API in one run: Chat.infer on a bf16 engine, interleaved.

    python benchmarks/bench_tree_ab.py --trees OLD_CHECKOUT . --model .pytest-assets/full --texts 8 --pairs 4

Each measurement is a fresh process (the tree first on sys.path) timing the best of 3 calls of Chat.infer on
`--texts` texts forced to 64 steps; trees alternate so a noisy host hits both alike. Writes results/tree_ab.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import sys, time, json
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(2)
from chattts_velocity import Chat, InferCodeParams
chat = Chat()
chat.load(source="custom", custom_path=sys.argv[2], verify=False, use_vllm=True, dtype="bfloat16")
texts = [f"Sentence number {i} is read aloud by the engine." for i in range(int(sys.argv[3]))]
p = InferCodeParams(max_new_token=64, min_new_token=64, manual_seed=1, show_tqdm=False)
chat.infer(texts[:2], skip_refine_text=True, params_infer_code=p)
times = []
for _ in range(3):
    t = time.perf_counter()
    chat.infer(texts, skip_refine_text=True, params_infer_code=p, split_text=False)
    times.append(time.perf_counter() - t)
print(json.dumps({"steps_per_s": 64 * len(texts) / min(times)}))
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs=2, required=True, help="two checkouts of this repository")
    parser.add_argument("--model", required=True, help="asset folder (random full-size weights are fine)")
    parser.add_argument("--texts", type=int, default=8)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "tree_ab.json"))
    args = parser.parse_args(argv)
    runs: dict[str, list[float]] = {tree: [] for tree in args.trees}
    for _ in range(args.pairs):
        for tree in args.trees:
            done = subprocess.run([sys.executable, "-c", CHILD, str(Path(tree).resolve()), args.model,
                                   str(args.texts)], capture_output=True, text=True, timeout=900)
            runs[tree].append(json.loads(done.stdout.strip().splitlines()[-1])["steps_per_s"])
    medians = {tree: statistics.median(v) for tree, v in runs.items()}
    old, new = args.trees
    report = {"texts": args.texts, "steps_per_s": runs, "median": medians,
              "ratio_second_over_first": medians[new] / medians[old]}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
