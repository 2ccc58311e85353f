"""The GPU check's figures, in one JSON naming the card (benchmarks/gpu_check.sh runs the GPU tests first, then this).

On one engine (bf16, the new backend: triton on CUDA; max_num_seqs 256 so 256 sequences run truly at once):
- `replay_ms`: one decode of the 20 layers at 1/16/64 rows and contexts 100 and 500, new backend (a CUDA graph
  replay) vs old (the torch backend, eager), CUDA events;
- `kernels_per_step` at 1 and 64 sequences (torch.profiler's CUDA kernels; on a CPU, LaunchCounter's launches);
- `steady_steps_per_s` at 1/16/64/256 (sequence-steps/s over steps after prefill and warm-up, no profiler), and
  `end_to_end_steps_per_s` (submission to last token); `overlapped_steps_per_s` the same with the engine's
  overlapped loop, null where the engine has no such option; `max_concurrent`, the widest step that ran;
- `invariant_alone_vs_63`: a seeded request's codes alone and among 63 others, bit-identical or not;
- `greedy_match_old`: the fraction of near-greedy codes the new and the old backend agree on;
- `stream64_audio_s_per_s` and `ttfa_s` {"1", "64"}: streaming clients (StreamSet, default options).
Each part that fails records its error under `errors` and the rest still runs.

    python -m benchmarks.gpu_check --device cuda --model demo          # writes benchmarks/results/gpu_check.json
    python -m benchmarks.gpu_check --dry-run --model .pytest-assets/tiny   # CPU, tiny, seconds; JSON to a tmp path
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
import traceback
from pathlib import Path

from benchmarks import gpu_check_parts as parts

REPO = Path(__file__).resolve().parents[1]

SIZES = (1, 16, 64, 256)
FULL = {"warm": 8, "steps": 100, "replay_repeats": 30, "old_replay_repeats": 5, "kernel_steps": 10,
        "invariance_steps": 300, "greedy": (4, 48), "stream_steps": 300, "stream_warm_up": True}
# the dry run: a step or two per part; 29 stream steps, as the first audio comes after 4 + 24
DRY = {"warm": 0, "steps": 1, "replay_repeats": 1, "old_replay_repeats": 1, "kernel_steps": 1,
       "invariance_steps": 3, "greedy": (1, 3), "stream_steps": 29, "stream_warm_up": False}


def load(args: argparse.Namespace, backend: str, max_num_seqs: int, **options):
    from chattts_velocity import load_pretrained
    from chattts_velocity.demo import ensure_model

    return load_pretrained(ensure_model(args.model)[0], is_vllm=True, device=args.device, dtype=args.dtype,
                           backend=backend, max_num_seqs=max_num_seqs, max_model_len=1024, **options)


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

    def part(name: str, fn) -> None:
        start = time.perf_counter()
        try:
            fn()
        except Exception as error:  # noqa: BLE001 -- one part failing must not lose the others' figures
            report["errors"][name] = f"{type(error).__name__}: {error}"
            traceback.print_exc()
        report["seconds"][name] = round(time.perf_counter() - start, 2)
        print(f"gpu_check: {name} done in {report['seconds'][name]} s", flush=True)
        save(report)

    option = parts.overlap_option()  # the figures beside the overlapped ones come from the synchronous loop
    llm = load(args, args.backend, max(SIZES), **({option: False} if option else {}))
    engine = llm.engine
    report["backend"] = engine.runner.backend.name
    kv = parts.paged_kv(engine.runner)
    old = TorchBackend(engine.runner.model, kv)

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
        for n in SIZES:
            row = parts.steady_decode(engine, n, plan["warm"], plan["steps"])
            report["steady_steps_per_s"][str(n)] = row["steady_steps_per_s"]
            report["steady_step_ms"][str(n)] = row["step_ms_median"]
            report["end_to_end_steps_per_s"][str(n)] = row["end_to_end_steps_per_s"]
            report["max_concurrent"] = max(report["max_concurrent"] or 0, row["max_concurrent"])

    def invariance() -> None:
        report["invariant_alone_vs_63"] = parts.invariant_alone_vs_others(engine, 63, plan["invariance_steps"])

    def greedy() -> None:
        old_llm = load(args, "torch", 8)
        report["greedy_match_old"] = parts.greedy_match(engine, old_llm.engine, *plan["greedy"])
        old_llm.shutdown()

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
                     ("greedy", greedy), ("streaming", streaming)):
        part(name, fn)
    llm.shutdown()
    report["overlap_option"] = option
    if option is not None:
        def overlapped() -> None:
            over = load(args, args.backend, max(SIZES), **{option: True})
            report["overlapped_steps_per_s"] = {str(n): parts.steady_decode(
                over.engine, n, plan["warm"], plan["steps"])["steady_steps_per_s"] for n in SIZES}
            over.shutdown()

        part("overlapped", overlapped)


def empty_report(args: argparse.Namespace, device: str) -> dict:
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"device": device, "mode": "dry-run" if args.dry_run else args.device, "torch": torch.__version__,
            "triton": triton_version, "dtype": args.dtype, "backend": None, "old_backend": "torch",
            "tests": _tests(args.tests), "replay_ms": {}, "kernels_per_step": {}, "kernels_counted_by": None,
            "steady_steps_per_s": {}, "steady_step_ms": {}, "end_to_end_steps_per_s": {},
            "overlap_option": None, "overlapped_steps_per_s": None, "max_concurrent": None,
            "invariant_alone_vs_63": None, "greedy_match_old": None, "streams": {}, "ttfa_s": {},
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
