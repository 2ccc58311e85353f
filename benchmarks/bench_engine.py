"""Benchmark: the velocity engine against the plain path (and the reference package) in the same run.

Every request is forced to the same length (min_new_token == max_new_token), so work is identical
across paths. Per concurrency level N the velocity engine runs N requests at once; the plain path
runs at N in --plain-sizes only (it is slow); the reference chattts 0.2.5 runs in its own venv with
--reference. Paths are interleaved within each repeat and ratios are taken inside one repeat, so a
busy host slows all of them alike. A matmul probe before and after each repeat reports how much CPU
the host grants. Each repeat then streams --ttfa-sizes requests through a StreamSet (lib/stream.py)
for the real time to first audio; the "first token" column is only the time to the first code step.
Usage (from a checkout):

    python -m benchmarks.bench_engine --model demo --dtype bfloat16 --concurrency 1,16,32
    python -m benchmarks.bench_engine --quick
    python -m benchmarks.bench_engine --device cuda --backend triton --dtype bfloat16 --concurrency 1,16,64,256

With --device cuda the engine, the plain path and the Decoder+Vocos run on the GPU; the CPU-only parts are skipped
(the CPU contention probe, the reference package, torch.compile of the decode step: the triton backend replays CUDA
graphs instead) and so are the streaming TTFA runs unless --ttfa-sizes is given. docs/gpu.md has the commands.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# torch and the package load lazily in run(), so `chattts-velocity bench --help` stays instant

TARGETS = (  # (label, velocity concurrency, plain concurrency, metric, target ratio)
    ("single stream vs plain@1", 1, 1, "steps_per_s", 3.0),
    ("32 concurrent vs plain@16 (GPT)", 32, 16, "steps_per_s", 6.0),
    ("32 concurrent vs plain@16 (end to end)", 32, 16, "audio_per_s_e2e", 4.0),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `python -m benchmarks.bench_engine` and of `chattts-velocity bench`."""
    parser.add_argument("--model", default="demo", help="asset folder, or 'demo' (random full-size weights)")
    parser.add_argument("--no-verify", action="store_true",
                        help="load custom or fine-tuned weights without the official sha256 check")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "int8"],
                        help="the engine's precision (auto, as on every other command: int8 where our CPU kernels "
                             "run, bfloat16 on CUDA, else float32; the choice is printed)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="where the engine, the plain path and the Decoder+Vocos run (cuda: see docs/gpu.md)")
    parser.add_argument("--backend", default="auto", choices=["auto", "torch", "cpu", "triton"],
                        help="the engine's decode backend (auto: triton on CUDA, cpu where its kernels build)")
    parser.add_argument("--compile", default="auto", choices=["auto", "on", "off"],
                        help="torch.compile the decode step (auto: on, except with --quick)")
    parser.add_argument("--concurrency", help="comma-separated request counts (default 1,8,16,32,64)")
    parser.add_argument("--plain-sizes", help="plain-path batch sizes, '' to skip (default 1,16)")
    parser.add_argument("--steps", type=int, help="forced code steps per request (default 100)")
    parser.add_argument("--repeats", type=int, help="interleaved rounds (default 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--decode-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="Decoder+Vocos precision (auto: bfloat16 unless --dtype float32)")
    parser.add_argument("--reference", action="store_true", help="also time chattts 0.2.5 in its venv")
    parser.add_argument("--no-e2e", action="store_true", help="skip Decoder+Vocos (GPT only)")
    parser.add_argument("--ttfa-sizes", help="request counts for the streaming time-to-first-audio runs, '' to skip "
                                             "(default 1,16)")
    parser.add_argument("--quick", action="store_true",
                        help="about one minute: defaults become 20 steps, N in 1,8, plain and TTFA at 1, one repeat, "
                             "no compile")
    parser.add_argument("--name", default=None, help="the results file: <--out>/<name>.json (default: a timestamp)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"), metavar="DIR",
                        help="folder for the JSON results (default: benchmarks/results, the docs' tables' source; "
                             "`chattts-velocity bench`: $CHATTTS_VELOCITY_CACHE/bench, outside the source tree)")


DEFAULTS = {"steps": 100, "repeats": 3, "concurrency": "1,8,16,32,64", "plain_sizes": "1,16", "ttfa_sizes": "1,16"}
QUICK = {"steps": 20, "repeats": 1, "concurrency": "1,8", "plain_sizes": "1", "ttfa_sizes": "1"}


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the defaults (--quick has its own; options given explicitly always win)."""
    if args.device == "cuda" and args.ttfa_sizes is None:
        args.ttfa_sizes = ""  # the streaming runs are CPU-verified only; ask for them explicitly on CUDA
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if (args.quick or args.device == "cuda") and args.compile == "auto":
        args.compile = "off"
    if args.device == "cuda" and args.reference:
        raise ValueError("--reference runs chattts 0.2.5 on CPU; it does not combine with --device cuda")
    args.concurrency_list = _ints(args.concurrency)
    args.plain_list = _ints(args.plain_sizes)
    args.ttfa_list = _ints(args.ttfa_sizes)
    args.compile_on = args.compile != "off"
    if args.dtype == "auto":
        from chattts_velocity.cli.common import resolve_dtype

        resolve_dtype(args)
    if args.decode_dtype == "auto":
        args.decode_dtype = "float32" if args.dtype == "float32" else "bfloat16"
    if args.steps < 1 or args.repeats < 1 or not args.concurrency_list:
        raise ValueError("--steps and --repeats must be >= 1 and --concurrency non-empty")
    return args


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise ValueError(f"counts must be >= 1, got {text!r}")
    return values


def run(args: argparse.Namespace) -> dict:
    """Load everything, run the interleaved repeats, print the tables and write the JSON."""
    args = resolve(args)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    from benchmarks.lib.runs import load_suite

    suite = load_suite(args)
    print(suite.describe(), flush=True)
    repeats = [run_repeat(suite, args, r) for r in range(args.repeats)]
    report = summarise(suite, args, repeats)
    path = Path(args.out) / f"{args.name or time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"\nresults written to {path}")
    return report


def run_repeat(suite, args: argparse.Namespace, index: int) -> dict:
    from benchmarks.lib.runs import run_plain, run_reference, run_velocity
    from benchmarks.lib.stream import run_sizes

    before = _probe(suite)
    runs = []
    for n in args.concurrency_list:
        runs.append(run_velocity(suite, n))
        print(runs[-1].line(), flush=True)
        if n in args.plain_list and suite.plain is not None:
            runs.append(run_plain(suite, n))
            print(runs[-1].line(), flush=True)
    stream_ttfa = run_sizes(suite, args.ttfa_list)
    if args.reference:
        for item in run_reference(suite, args.plain_list or [1]):
            runs.append(item)
            print(runs[-1].line(), flush=True)
    after = _probe(suite)
    ratios = same_run_ratios(runs)
    print(f"repeat {index + 1}/{args.repeats}: probe before {before['summary']}, after {after['summary']}")
    for label, value in ratios.items():
        print(f"  {label}: {value:.2f}x")
    return {"probe_before": before, "probe_after": after, "runs": [r.as_dict() for r in runs], "ratios": ratios,
            "stream_ttfa": stream_ttfa}


def _probe(suite) -> dict:
    """How much CPU the host grants (a CPU GEMM loop); on CUDA the engine's speed does not depend on it."""
    from benchmarks.lib import probe

    if suite.device != "cpu":
        return {"summary": f"skipped on {suite.device}"}
    return probe.contention_probe(suite.threads)


def same_run_ratios(runs: list) -> dict[str, float]:
    """velocity / plain (and velocity / reference) for every target and matching concurrency."""
    by = {(r.path, r.concurrency): r for r in runs}
    ratios: dict[str, float] = {}
    for label, n_fast, n_base, metric, _ in TARGETS:
        for base in ("plain", "reference"):
            fast, slow = by.get(("velocity", n_fast)), by.get((base, n_base))
            if fast and slow and getattr(slow, metric):
                ratios[label.replace("plain", base)] = getattr(fast, metric) / getattr(slow, metric)
                if metric == "steps_per_s":  # the same comparison per CPU-second: robust to a busy host
                    ratios[label.replace("plain", base) + " [per CPU-s]"] = fast.steps_per_cpu_s / slow.steps_per_cpu_s
    for (path, n), slow in by.items():
        fast = by.get(("velocity", n))
        if path != "velocity" and fast:
            ratios[f"velocity@{n} / {path}@{n} (GPT)"] = fast.steps_per_s / slow.steps_per_s
            ratios[f"velocity@{n} / {path}@{n} (steps per CPU-s)"] = fast.steps_per_cpu_s / slow.steps_per_cpu_s
    return ratios


def summarise(suite, args: argparse.Namespace, repeats: list[dict]) -> dict:
    keys = sorted({(r["path"], r["concurrency"]) for rep in repeats for r in rep["runs"]})
    rows = []
    print(f"\n{'path':<10}{'N':>4}{'steps/s best':>14}{'median':>9}{'audio s/s GPT':>15}{'e2e':>7}"
          f"{'1st token s':>13}{'cores used':>12}{'steps/CPU-s':>13}{'peak RSS MB':>13}")
    for path, n in keys:
        runs = [r for rep in repeats for r in rep["runs"] if (r["path"], r["concurrency"]) == (path, n)]
        row = {"path": path, "concurrency": n, **_best_and_median(runs)}
        rows.append(row)
        print(f"{path:<10}{n:>4}{row['steps_per_s_best']:>14.1f}{row['steps_per_s_median']:>9.1f}"
              f"{row['audio_per_s_gpt_median']:>15.2f}{row['audio_per_s_e2e_median']:>7.2f}"
              f"{row['ttft_mean_median']:>13.2f}{row['cores_used_median']:>12.2f}"
              f"{row['steps_per_cpu_s_median']:>13.1f}{row['peak_rss_mb']:>13.0f}")
    ratios = {label: statistics.median(rep["ratios"][label] for rep in repeats if label in rep["ratios"])
              for label in {k for rep in repeats for k in rep["ratios"]}}
    print("\nsame-run ratios (median over repeats; against TARGETS):")
    for label in sorted(ratios):
        target = next((t for name, *_, t in TARGETS if name == label), None)
        met = target is not None and ratios[label] >= target
        verdict = "" if target is None else f" (target {target:.0f}x: {'met' if met else 'MISSED'})"
        print(f"  {label}: {ratios[label]:.2f}x{verdict}")
    from benchmarks.lib.stream import summarise as summarise_stream

    return {"config": suite.config(args), "rows": rows, "ratios": ratios, "stream_ttfa": summarise_stream(repeats),
            "repeats": repeats}


def _best_and_median(runs: list[dict]) -> dict:
    out: dict[str, float] = {}
    for key in ("steps_per_s", "audio_per_s_gpt", "audio_per_s_e2e", "ttft_mean", "cores_used", "steps_per_cpu_s"):
        values = [r[key] for r in runs]
        out[f"{key}_median"] = statistics.median(values)
        out[f"{key}_best"] = min(values) if key == "ttft_mean" else max(values)
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="chattts-velocity bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    try:
        run(parser.parse_args(argv))
    except (ValueError, FileNotFoundError) as exc:
        raise SystemExit(f"error: {exc}") from None


if __name__ == "__main__":
    main()
