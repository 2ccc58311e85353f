"""The GPU check's measurements and its one JSON (benchmarks/gpu_check.sh runs the tests first, then this).

Per backend (triton, torch) bench_engine's GPT-only runs at each concurrency (bf16, forced lengths), the ratio of
the measured sequence-steps/s to the bandwidth roofline (weights read once per step plus each sequence's KV, at
--bandwidth-tbs), host syncs per decode step (devtools/sync_detector.py around engine.step()) and the streaming time
to first audio at one request. Runs on CPU too (a tiny model, one short run): tests/engine/test_gpu_check.py
checks the JSON's shape that way.

    python benchmarks/gpu_check.py --device cuda --model demo --out benchmarks/results/gpu_check.json
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

BANDWIDTH_TBS = {"H200": 4.8, "H100": 3.35, "A100": 2.0}  # datasheet HBM bandwidth by the name CUDA reports


def datasheet_bandwidth(device_name: str) -> float:
    """The datasheet bandwidth of a GPU named like CUDA names it (an H100 SXM's 3.35 TB/s when unknown)."""
    return next((tbs for key, tbs in BANDWIDTH_TBS.items() if key in device_name), BANDWIDTH_TBS["H100"])


def roofline_steps_per_s(params: int, kv_bytes_per_position: int, batch: int, context: int, bandwidth: float,
                         weight_bytes: int = 2) -> float:
    """Sequence-steps/s if a decode step only read the weights once and each sequence's KV once."""
    step_bytes = params * weight_bytes + batch * context * kv_bytes_per_position
    return batch / (step_bytes / (bandwidth * 1e12))


def host_syncs_per_step(llm, steps: int = 4) -> float:
    """Mean syncs per decode step (SyncDetector) of `steps` steps of 2 requests after their prefill."""
    import torch

    from chattts_velocity.devtools.sync_detector import SyncDetector
    from chattts_velocity.schema import Prompt, SamplingParams

    engine, cfg = llm.engine, llm.engine.config
    for i in range(2):
        ids = torch.full((12, cfg.num_vq), 7 + i, dtype=torch.int64)
        engine.add_request(f"sync-{i}", Prompt(ids, torch.zeros(12, dtype=torch.bool)),
                           SamplingParams(max_new_token=steps + 2, min_new_token=steps + 2, seed=i))
    engine.step()
    engine.step()
    counts = []
    for _ in range(steps):
        with SyncDetector() as syncs:
            engine.step()
        counts.append(syncs.count)
    while engine.has_unfinished_requests():
        engine.step()
    return sum(counts) / len(counts)


def run_backend(args: argparse.Namespace, backend: str) -> dict:
    from benchmarks import bench_engine

    parser = argparse.ArgumentParser()
    bench_engine.add_arguments(parser)
    bench_args = parser.parse_args(
        ["--model", args.model, "--device", args.device, "--backend", backend, "--dtype", args.dtype,
         "--concurrency", args.concurrency, "--plain-sizes", "", "--steps", str(args.steps), "--repeats", "1",
         "--ttfa-sizes", "1", "--compile", "off", "--name", f"gpu_check_{backend}", "--out", args.work])
    start = time.perf_counter()
    report = bench_engine.run(bench_args)
    from chattts_velocity import load_pretrained
    from chattts_velocity.demo import ensure_model

    llm = load_pretrained(ensure_model(args.model)[0], is_vllm=True, device=args.device, dtype=args.dtype,
                          backend=backend)
    cfg = llm.engine.config
    params = sum(p.numel() for p in llm.engine.runner.model.parameters())
    kv_per_position = cfg.num_hidden_layers * 2 * cfg.hidden_size * 2
    rows = {}
    for row in report["rows"]:
        n, context = row["concurrency"], 20 + args.steps // 2  # a short prompt, then half the forced steps
        roof = roofline_steps_per_s(params, kv_per_position, n, context, args.bandwidth_tbs)
        rows[str(n)] = {"steps_per_s": row["steps_per_s_median"], "roofline_steps_per_s": roof,
                        "roofline_ratio": row["steps_per_s_median"] / roof}
    ttfa = [r["ttfa_max"] for r in report["stream_ttfa"] if r["concurrency"] == 1]
    return {"backend": llm.engine.runner.backend.name, "concurrency": rows,
            "host_syncs_per_decode_step": host_syncs_per_step(llm),
            "ttfa_s": ttfa[0] if ttfa else None, "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> dict:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--model", default="demo", help="asset folder, or 'demo' (random full-size weights)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--backends", default="triton,torch")
    parser.add_argument("--concurrency", default="1,16,64,256")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--bandwidth-tbs", type=float,
                        help="the GPU's memory bandwidth, TB/s (default: its datasheet figure, by name)")
    parser.add_argument("--tests", help="pytest's junit XML of the GPU tests, summarised into the JSON")
    parser.add_argument("--work", default=str(REPO / "benchmarks" / "results" / "gpu_check_runs"))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "gpu_check.json"))
    args = parser.parse_args(argv)
    device = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
    args.bandwidth_tbs = args.bandwidth_tbs or datasheet_bandwidth(device)
    report = {"device": device, "torch": torch.__version__, "dtype": args.dtype, "steps": args.steps,
              "bandwidth_tbs": args.bandwidth_tbs, "tests": _tests(args.tests),
              "backends": {b: run_backend(args, b) for b in args.backends.split(",")}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(json.dumps(report, indent=1))
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
