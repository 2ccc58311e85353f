"""Two source trees of this package in one run, interleaved: the one harness for every "before vs after" figure.

    python -m benchmarks.tree_ab --trees OLD_CHECKOUT . --model .pytest-assets/full --case chat --sizes 1,8,32
    python -m benchmarks.tree_ab --trees OLD_CHECKOUT . --model .pytest-assets/full --case gpt --sizes 1,16,64
    python -m benchmarks.tree_ab ... --case gpt --noamx --out /tmp/invariance_ab_noamx.json
    python -m benchmarks.tree_ab --trees OLD_CHECKOUT . --case kernels --dtypes bfloat16,int8,int4 --sizes 1,16,64

Cases (each measurement is a fresh process with its tree first on its path):
- `chat`: `Chat.infer` through the public API (refine off, one seeded text per size, forced to --steps code steps,
  Decoder + Vocos included), best of 2 calls, 2 threads: code steps per second end to end.
- `gpt`: the velocity GPT alone (`load_pretrained(is_vllm=True)`, N seeded requests forced to --steps, prefill
  included), best of 2 `generate` calls, 2 threads: code steps per second.
- `kernels`: the C++ linears of this CPU's library on 10 layers' projections (full-size shapes, random weights) at
  --sizes rows, the AVX-512 tiles and (where AMX runs) the AMX panels (--dtypes bfloat16, int8, int4: int4 has tiles
  only), best of 7, 1 thread: bf16 weight GB per CPU-second. --model is not used.
Trees alternate pair by pair so a noisy host hits both alike; the ratio new / old is the median of the per-pair
ratios, and `same_output` says whether every run of both trees gave bit-identical output (codes, audio, linears).
Writes --out (default: a temporary file, printed) as {"trees", "case", "steps", "noamx", "results": {dtype: {key:
{"old", "new", "ratio_new_over_old", "same_output"}}}} (the shape docs tables read).
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

from benchmarks.lib.ab import interleaved

PRELUDE = r"""
import hashlib, sys, time, json
import torch
torch.set_num_threads(2)
model, dtype, sizes, steps = sys.argv[2], sys.argv[3], [int(s) for s in sys.argv[4].split(",")], int(sys.argv[5])
if sys.argv[6] == "noamx":  # every tree looks kernels.amx_ready up at call time: the route of CPUs without AMX
    from chattts_velocity.model import kernels
    kernels.amx_ready = lambda: False
def digest(tensors):
    return hashlib.sha1(b"".join(torch.as_tensor(t).contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                                 for t in tensors)).hexdigest()[:16]
def best_of_two(run):
    run(2)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        out = run(None)
        times.append(time.perf_counter() - start)
    return min(times), out
figures, digests = {}, {}
"""

CASES = {
    "chat": PRELUDE + r"""
from chattts_velocity import Chat, InferCodeParams
chat = Chat()
chat.load(source="custom", custom_path=model, verify=False, use_vllm=True, dtype=dtype)
for n in sizes:
    texts = [f"Sentence number {i} is read aloud by the engine." for i in range(n)]
    params = InferCodeParams(max_new_token=steps, min_new_token=steps, manual_seed=1, show_tqdm=False)
    def run(limit):
        return chat.infer(texts[:limit] if limit else texts, skip_refine_text=True, params_infer_code=params,
                          split_text=False)
    seconds, wavs = best_of_two(run)
    figures[n], digests[n] = n * steps / seconds, digest(wavs)
print(json.dumps({"figures": figures, "digests": digests}))
""",
    "gpt": PRELUDE + r"""
from chattts_velocity import load_pretrained, InferCodeParams
from chattts_velocity.schema import Prompt
llm = load_pretrained(model, is_vllm=True, dtype=dtype)
for n in sizes:
    prompts = [Prompt(torch.full((20, 4), 100 + i), torch.ones(20, dtype=torch.bool)) for i in range(n)]
    params = [InferCodeParams(manual_seed=i, max_new_token=steps, min_new_token=steps).to_sampling_params(
        "code", 625, True) for i in range(n)]
    def run(limit):
        return llm.generate(prompts[:limit] if limit else prompts, params[:limit] if limit else params,
                            progress=False)
    seconds, outputs = best_of_two(run)
    figures[n], digests[n] = n * steps / seconds, digest(o.token_ids for o in outputs)
print(json.dumps({"figures": figures, "digests": digests}))
""",
    "kernels": PRELUDE + r"""
from chattts_velocity.model import kernels
from chattts_velocity.model.packed import _quantize_int8
torch.set_num_threads(1)
SHAPES = [(2304, 768), (768, 768), (6144, 768), (768, 3072)]  # fused q/k/v, o, fused gate/up, down
gen = torch.Generator().manual_seed(0)
weights = [torch.randn(n, k, generator=gen) * 0.02 for _ in range(10) for n, k in SHAPES]
if dtype == "bfloat16":
    op, rows_of = kernels.ops().linear_bf16, [w.bfloat16() for w in weights]
    packs = {"tiles": [(kernels.to_tiles(w, 32),) for w in rows_of], "amx": [(kernels.to_panels(w),) for w in rows_of]}
elif dtype == "int4":  # tiles [N/4, K/32, 4, 16]: no AMX layout
    op = kernels.ops().linear_int4
    packs = {"tiles": [kernels.to_int4_tiles(*kernels.quantize_int4(w)) for w in weights]}
else:
    op, quantized = kernels.ops().linear_int8, [_quantize_int8(w) for w in weights]
    packs = {"tiles": [(kernels.to_tiles(q, 16), s) for q, s in quantized],
             "amx": [(kernels.to_panels(q), s) for q, s in quantized]}
if not kernels.amx_ready():
    packs.pop("amx", None)
gigabytes = sum(n * k for n, k in SHAPES) * 10 * 2 / 1e9
with torch.inference_mode():
    for rows in sizes:
        x = {k: torch.randn(rows, k, generator=gen).bfloat16() for k in (768, 3072)}
        columns = 32 if dtype == "int4" else None  # per step of the layout: else 16 (int8 tiles) or shape[3]
        calls = {name: (lambda p=p: [op(x[w.shape[1] * (columns or (2 if w.shape[2] == 16 else w.shape[3]))], w, *rest)
                                     for w, *rest in p]) for name, p in packs.items()}
        best = {name: float("inf") for name in calls}
        for turn in range(8):  # the first is a warm-up
            for name, call in calls.items():
                start = time.process_time()
                out = call()
                if turn:
                    best[name] = min(best[name], time.process_time() - start)
                digests[f"{name}, {rows} rows"] = digest(out)
        figures.update({f"{name}, {rows} rows": gigabytes / seconds for name, seconds in best.items()})
print(json.dumps({"figures": figures, "digests": digests}))
""",
}

def measure(case: str, tree: str, args: argparse.Namespace, dtype: str) -> dict[str, dict]:
    """One fresh process of `tree` -> {"figures": {key: figure}, "digests": {key: output digest}}."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"} if args.noamx else dict(os.environ)
    env["PYTHONPATH"] = str(Path(tree).resolve())  # the child's tree first on its path
    done = subprocess.run([sys.executable, "-c", CASES[case], str(Path(tree).resolve()), str(args.model), dtype,
                           args.sizes, str(args.steps), "noamx" if args.noamx else "amx"],
                          capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode:
        raise SystemExit(f"error: the {case} case failed in {tree}:\n{done.stderr[-2000:]}")
    result: dict[str, dict] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def compare(old: list[dict[str, float]], new: list[dict[str, float]]) -> dict[str, dict]:
    return {key: {"old": [r[key] for r in old], "new": [r[key] for r in new],
                  "ratio_new_over_old": statistics.median(b[key] / a[key] for a, b in zip(old, new, strict=True))}
            for key in old[0]}


def same_outputs(runs: list[dict[str, str]]) -> dict[str, bool]:
    """Per key: whether every run (of either tree) produced the same output digest."""
    return {key: len({run[key] for run in runs}) == 1 for key in runs[0]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs=2, required=True, metavar=("OLD", "NEW"), help="two checkouts of this repo")
    parser.add_argument("--model", help="asset folder (random full-size weights are fine); chat and gpt need it")
    parser.add_argument("--case", choices=sorted(CASES), default="chat", help="what to time (see above)")
    parser.add_argument("--dtypes", default="bfloat16", help="comma-separated precisions (default bfloat16)")
    parser.add_argument("--sizes", default="1,8,32", help="texts (chat), requests (gpt) or rows (kernels) per call")
    parser.add_argument("--steps", type=int, default=64, help="forced code steps per request (default 64)")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved old/new pairs (default 3)")
    parser.add_argument("--noamx", action="store_true", help="both trees take the route of CPUs without AMX")
    parser.add_argument("--out", help="JSON to write (default: a file in the temporary folder)")
    args = parser.parse_args(argv)
    if args.model is None and args.case != "kernels":
        parser.error(f"--case {args.case} needs --model")
    results = {}
    for dtype in args.dtypes.split(","):
        print(dtype, flush=True)
        runs = interleaved(args.trees, args.pairs, lambda tree, dtype=dtype: measure(args.case, tree, args, dtype),
                           echo=True)
        old, new = runs
        same = same_outputs([r["digests"] for r in old + new])
        results[dtype] = {key: {**cell, "same_output": same[key]}
                          for key, cell in compare([r["figures"] for r in old], [r["figures"] for r in new]).items()}
    report = {"trees": args.trees, "case": args.case, "steps": args.steps, "noamx": args.noamx, "results": results}
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tree_ab_")) / "tree_ab.json"
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps(results, indent=1), f"\nwritten: {out}", sep="")
    return report


if __name__ == "__main__":
    main()
