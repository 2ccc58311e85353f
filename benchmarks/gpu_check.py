"""The GPU check's figures, in one JSON naming the card (benchmarks/gpu_check.sh runs the GPU tests first, then this).

On one engine (bf16, the new backend: triton on CUDA; the default max_model_len; max_num_seqs 256 so 256 sequences
run truly at once), prompts of 100 to 300 positions (`shape`: max_model_len, prompt_positions and the contexts the
timed decode steps ran at, ~300 to ~600):
- `replay_ms`: one decode of the 20 layers at 1/16/64 rows and contexts 100 and 500, new backend (a CUDA graph
  replay) vs old (the torch backend, eager), CUDA events;
- `kernels_per_step` at 1 and 64 sequences (torch.profiler's CUDA kernels; on a CPU, LaunchCounter's launches);
- `steady_steps_per_s` at 1/16/64/256 (sequence-steps/s over steps after prefill and warm-up, no profiler), and
  `end_to_end_steps_per_s` (submission to last token); `overlapped_steps_per_s` the same with the engine's
  overlapped loop, null where the engine has no such option; `max_concurrent`, the widest step that ran;
- `invariant_alone_vs_63`: a seeded request's codes alone and among 63 others, bit-identical or not (and
  `invariant_alone_vs_63_overlapped`, the same in the overlapped loop);
- `gemm_tbs` {name: {M: TB/s}}: each layer GEMM alone at 1/16/64/256 rows, its weight's bytes over its time;
  `bandwidth_tbs` the card's HBM bandwidth (from its name, else measured) and `gemm_hbm_fraction` {"1", "64"} the
  slowest layer GEMM's share of it;
- `stream64_audio_s_per_s` and `ttfa_s` {"1", "64"}: streaming clients (StreamSet, default options).
No near-greedy comparison with the old backend: in bf16 the two backends round differently, a near tie between the
two best codes can go either way, and from the first differing code on the sequences diverge (each step feeds the
last), so the share of equal codes measures where the first tie fell, not correctness (the kernels are checked
against torch by the tests).
Each part runs under its own time limit (`PART_SECONDS`); a part that fails or runs out of time records it under
`errors`, its requests are aborted and the rest still runs. The JSON names the card, torch, Triton and CUDA.

    python -m benchmarks.gpu_check --device cuda --model demo          # writes benchmarks/results/gpu_check.json
    python -m benchmarks.gpu_check --dry-run --model .pytest-assets/tiny   # CPU, tiny, seconds; JSON to a tmp path
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks import gpu_check_parts as parts

REPO = Path(__file__).resolve().parents[1]

SIZES = (1, 16, 64, 256)
# prompts of 100-300 positions, 150 warm steps: the timed 150 steps run at contexts of ~250-450 up to ~400-600
FULL = {"warm": 150, "steps": 150, "replay_repeats": 30, "old_replay_repeats": 5, "kernel_steps": 10,
        "invariance_steps": 300, "stream_steps": 300, "stream_warm_up": True, "prompt_positions": (100, 300),
        "gemm_repeats": 25, "gemm_shape": (768, 3072, 12, 64), "time_scale": 1.0}
# the dry run: a step or two per part; 29 stream steps, as the first audio comes after 4 + 24
DRY = {"warm": 0, "steps": 1, "replay_repeats": 1, "old_replay_repeats": 1, "kernel_steps": 1,
       "invariance_steps": 3, "stream_steps": 29, "stream_warm_up": False, "prompt_positions": (4, 12),
       "gemm_repeats": 1, "gemm_shape": (64, 128, 2, 32), "time_scale": 20.0}  # time limits x20 on a slow CPU
# each part's time limit on a GPU (s): 187 s in all, with two loads inside gpu_check.sh's 230 s for this script
PART_SECONDS = {"replay": 20, "kernels": 12, "steady": 45, "invariance": 20, "gemm": 15, "streaming": 30,
                "overlapped": 45}


class PartTimeout(Exception):
    """A part ran past its time limit."""


def timed_part(report: dict, name: str, fn, seconds: float, save, cleanup=lambda: None) -> None:
    """fn() under a time limit of `seconds` (SIGALRM: Python code is interrupted between its calls); an error or
    the limit goes under report["errors"][name], then cleanup(); the time under report["seconds"]; save(report)."""
    def expired(signum, frame):
        raise PartTimeout(f"timed out after {seconds} s")

    start = time.perf_counter()
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        fn()
    except Exception as error:  # noqa: BLE001 -- one part failing must not lose the others' figures
        signal.setitimer(signal.ITIMER_REAL, 0)
        report["errors"][name] = f"{type(error).__name__}: {error}"
        traceback.print_exc()
        try:
            cleanup()
        except Exception as again:  # noqa: BLE001 -- say so, and go on
            report["errors"][name] += f"; cleanup: {type(again).__name__}: {again}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    report["seconds"][name] = round(time.perf_counter() - start, 2)
    print(f"gpu_check: {name} done in {report['seconds'][name]} s", flush=True)
    save(report)


def load(args: argparse.Namespace, backend: str, max_num_seqs: int, **options):
    from chattts_velocity import load_pretrained
    from chattts_velocity.demo import ensure_model

    return load_pretrained(ensure_model(args.model)[0], is_vllm=True, device=args.device, dtype=args.dtype,
                           backend=backend, max_num_seqs=max_num_seqs, **options)


def mel_source(args: argparse.Namespace, device: str):
    import torch

    from chattts_velocity import audio
    from chattts_velocity.assets import AssetPaths
    from chattts_velocity.demo import ensure_model
    from chattts_velocity.precision import Precision
    from chattts_velocity.speech import DecoderSource

    paths = AssetPaths.from_root(ensure_model(args.model)[0])
    decoder = audio.Decoder.from_state_dict(audio.load_safetensors(paths.decoder)).to(device).eval()
    vocos = audio.Vocos.from_state_dict(audio.load_safetensors(paths.vocos)).to(device).eval()
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    decoder, vocos = audio.cast_for_autocast(decoder, dtype), audio.cast_for_autocast(vocos, dtype)
    audio_dtype = "bfloat16" if dtype else "float32"
    return DecoderSource(decoder, vocos, Precision.decide(device=device, decode_dtype=audio_dtype))


def measure(args: argparse.Namespace, plan: dict, report: dict, save) -> None:
    """Every part into report (errors under report["errors"]); `save(report)` after each, so a run stopped by its
    time limit keeps the parts it finished."""
    from chattts_velocity.engine.worker.backends.torch_backend import TorchBackend

    scale = plan["time_scale"]
    parts.PROMPT_POSITIONS = plan["prompt_positions"]
    option = parts.overlap_option()  # the figures beside the overlapped ones come from the synchronous loop
    llm = load(args, args.backend, max(SIZES), **({option: False} if option else {}))
    engine = llm.engine
    report["backend"] = engine.runner.backend.name
    report["shape"] = {"max_model_len": engine.engine_config.max_model_len,
                       "prompt_positions": list(plan["prompt_positions"]), "context_positions": None}
    kv = parts.paged_kv(engine.runner)
    old = TorchBackend(engine.runner.model, kv)

    def part(name: str, fn, on=None) -> None:
        timed_part(report, name, fn, PART_SECONDS[name] * scale, save, lambda: parts.drain(on or engine))

    def replay() -> None:
        for label, backend, repeats in (("new", engine.runner.backend, plan["replay_repeats"]),
                                        ("old", old, plan["old_replay_repeats"])):
            report["replay_ms"][label] = {str(n): {str(c): parts.replay_ms(backend, kv, n, c, repeats)
                                                   for c in (100, 500)} for n in (1, 16, 64)}

    def kernels() -> None:
        for n in (1, 64):
            report["kernels_per_step"][str(n)], report["kernels_counted_by"] = parts.kernels_per_step(
                engine, n, plan["kernel_steps"])

    def steady() -> None:
        low, high = None, None
        for n in SIZES:
            row = parts.steady_decode(engine, n, plan["warm"], plan["steps"])
            report["steady_steps_per_s"][str(n)] = row["steady_steps_per_s"]
            report["steady_step_ms"][str(n)] = row["step_ms_median"]
            report["end_to_end_steps_per_s"][str(n)] = row["end_to_end_steps_per_s"]
            report["max_concurrent"] = max(report["max_concurrent"] or 0, row["max_concurrent"])
            low = row["contexts"][0] if low is None else min(low, row["contexts"][0])
            high = row["contexts"][1] if high is None else max(high, row["contexts"][1])
            report["shape"]["context_positions"] = [low, high]

    def invariance() -> None:
        report["invariant_alone_vs_63"] = parts.invariant_alone_vs_others(engine, 63, plan["invariance_steps"])

    def gemms() -> None:
        device = engine.runner.device
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            report["gemm_tbs"] = "not run: Triton kernels on a CPU need TRITON_INTERPRET=1"
            return
        report["bandwidth_tbs"], report["bandwidth_from"] = parts.bandwidth_tbs(device)
        report["gemm_tbs"] = parts.gemm_tbs(device, repeats=plan["gemm_repeats"], shape=plan["gemm_shape"])
        report["gemm_hbm_fraction"] = {str(m): parts.hbm_fraction(report["gemm_tbs"], report["bandwidth_tbs"], m)
                                       for m in (1, 64)}

    def streaming() -> None:
        mel = mel_source(args, args.device)
        for n in (1, 64):
            if plan["stream_warm_up"]:  # the first pass captures the audio windows' CUDA graphs for this batch
                parts.streaming_clients(engine, mel, n, plan["stream_steps"])
            run = parts.streaming_clients(engine, mel, n, plan["stream_steps"])
            report["ttfa_s"][str(n)] = run["ttfa_s"]
            report["streams"][str(n)] = run
        report["stream64_audio_s_per_s"] = report["streams"]["64"]["audio_s_per_s"]

    for name, fn in (("replay", replay), ("kernels", kernels), ("steady", steady), ("invariance", invariance),
                     ("gemm", gemms), ("streaming", streaming)):
        part(name, fn)
    llm.shutdown()
    report["overlap_option"] = option
    if option is not None:
        over = load(args, args.backend, max(SIZES), **{option: True})

        def overlapped() -> None:
            report["overlapped_steps_per_s"] = {}
            for n in SIZES:
                report["overlapped_steps_per_s"][str(n)] = parts.steady_decode(
                    over.engine, n, plan["warm"], plan["steps"])["steady_steps_per_s"]
            report["invariant_alone_vs_63_overlapped"] = parts.invariant_alone_vs_others(
                over.engine, 63, plan["invariance_steps"])

        part("overlapped", overlapped, on=over.engine)
        over.shutdown()


def empty_report(args: argparse.Namespace, device: str) -> dict:
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"device": device, "mode": "dry-run" if args.dry_run else args.device, "torch": torch.__version__,
            "triton": triton_version, "cuda": torch.version.cuda, "dtype": args.dtype, "backend": None,
            "old_backend": "torch", "shape": None,
            "tests": _tests(args.tests), "replay_ms": {}, "kernels_per_step": {}, "kernels_counted_by": None,
            "steady_steps_per_s": {}, "steady_step_ms": {}, "end_to_end_steps_per_s": {},
            "overlap_option": None, "overlapped_steps_per_s": None, "max_concurrent": None,
            "invariant_alone_vs_63": None, "invariant_alone_vs_63_overlapped": None, "bandwidth_tbs": None,
            "bandwidth_from": None, "gemm_tbs": None, "gemm_hbm_fraction": None, "streams": {}, "ttfa_s": {},
            "stream64_audio_s_per_s": None, "errors": {}, "seconds": {}}


def main(argv: list[str] | None = None) -> dict:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--model", default="demo", help="asset folder, or 'demo' (random full-size weights)")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 (float32 with --dry-run)")
    parser.add_argument("--backend", default=None, help="the new backend (default: triton; torch with --dry-run)")
    parser.add_argument("--dry-run", action="store_true",
                        help="on the CPU, few steps (for a tiny model): checks the script, not the GPU")
    parser.add_argument("--tests", help="pytest's junit XML of the GPU tests, summarised into the JSON")
    parser.add_argument("--out", help="default: benchmarks/results/gpu_check.json (a tmp file with --dry-run)")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.device = "cpu"
    args.dtype = args.dtype or ("float32" if args.dry_run else "bfloat16")
    args.backend = args.backend or ("torch" if args.dry_run else "triton")
    default_out = (Path(tempfile.gettempdir()) / "gpu_check_dry_run.json" if args.dry_run
                   else REPO / "benchmarks" / "results" / "gpu_check.json")
    out = Path(args.out) if args.out else default_out
    cpu = f"cpu ({platform.processor() or platform.machine()})"
    device = torch.cuda.get_device_name() if args.device == "cuda" else cpu
    report = empty_report(args, device)
    start, threads = time.perf_counter(), torch.get_num_threads()
    if args.dry_run:
        torch.set_num_threads(1)  # a tiny model gains nothing from threads; on a shared host they only spin
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(report: dict) -> None:
        out.write_text(json.dumps(report, indent=1), encoding="utf-8")

    try:
        with torch.inference_mode():
            measure(args, DRY if args.dry_run else FULL, report, save)
    finally:
        torch.set_num_threads(threads)
    report["seconds"]["total"] = round(time.perf_counter() - start, 2)
    save(report)
    print(json.dumps({k: v for k, v in report.items() if k != "streams"}, indent=1))
    return report


def _tests(junit: str | None) -> dict | None:
    """passed/failed/skipped counts and the failing tests' names from pytest's junit XML."""
    if not junit or not Path(junit).is_file():
        return None
    import xml.etree.ElementTree as ET

    cases = ET.parse(junit).getroot().iter("testcase")
    out: dict = {"passed": 0, "failed": [], "skipped": 0}
    for case in cases:
        if case.find("failure") is not None or case.find("error") is not None:
            out["failed"].append(f"{case.get('classname')}::{case.get('name')}")
        elif case.find("skipped") is not None:
            out["skipped"] += 1
        else:
            out["passed"] += 1
    return out


if __name__ == "__main__":
    main()
