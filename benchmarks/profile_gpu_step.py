"""Where a decode step's time goes on a GPU: the whole step (host + device) against the graph replay alone.

For each batch size: N forced-length requests on the triton backend (bf16), then per decode step the wall time of
`engine.step()` with no profiler attached, the device time of one CUDA-graph replay of the layers (CUDA events),
and, over further steps of their own, a cProfile of the host work (the functions with the most own time; the step
time under cProfile is recorded apart, as `cprofile_step_ms_median`). The gap between the step and the replay is
host work the GPU waits for. Writes results/profile_gpu_step.json.

    python -m benchmarks.profile_gpu_step --sizes 1,64 --steps 100
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _requests(engine, n: int, steps: int) -> None:
    import torch

    from chattts_velocity.schema import Prompt, SamplingParams

    num_vq = engine.config.num_vq
    for i in range(n):
        ids = torch.full((20, num_vq), 7 + i % 50, dtype=torch.int64)
        engine.add_request(f"p{n}-{i}", Prompt(ids, torch.zeros(20, dtype=torch.bool)),
                           SamplingParams(max_new_token=steps, min_new_token=steps, seed=i))


def replay_ms(backend, n: int, repeats: int = 50) -> float:
    """Device time of one graph replay for n rows (CUDA events, median)."""
    import torch

    from chattts_velocity.engine.worker.step_inputs import StepTensors

    kv = backend.kv
    x = torch.randn(n, backend.model.config.hidden_size, device=kv.device, dtype=torch.bfloat16)
    step = StepTensors.from_lists([1] * n, [16] * n, [[kv.pad_block]] * n, kv.block_size, kv.device)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.inference_mode():
            backend.run(x, step)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def timed_steps(engine, steps: int, profiler: cProfile.Profile | None = None) -> list[float]:
    """Wall ms of each of `steps` engine steps (the profiler, if any, on during each step only)."""
    walls = []
    for _ in range(steps):
        start = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        engine.step()
        if profiler is not None:
            profiler.disable()
        walls.append((time.perf_counter() - start) * 1e3)
    return walls


def profile_size(llm, n: int, steps: int, top: int) -> dict:
    import torch

    engine = llm.engine
    _requests(engine, n, 2 * steps + 8)
    for _ in range(4):  # the prefill and first decode steps
        engine.step()
    torch.cuda.synchronize()
    bare = statistics.median(timed_steps(engine, steps))
    profiler = cProfile.Profile()
    profiled = statistics.median(timed_steps(engine, steps, profiler))
    while engine.has_unfinished_requests():
        engine.step()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    replay = replay_ms(engine.runner.backend, n)
    return {"step_ms_median": bare, "cprofile_step_ms_median": profiled, "graph_replay_ms": replay,
            "host_share": 1 - replay / bare, "top_tottime": text.getvalue()}


def main(argv: list[str] | None = None) -> dict:
    import torch

    from chattts_velocity import load_pretrained
    from chattts_velocity.demo import ensure_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--sizes", default="1,64")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "profile_gpu_step.json"))
    args = parser.parse_args(argv)
    llm = load_pretrained(ensure_model(args.model)[0], is_vllm=True, device="cuda", dtype="bfloat16",
                          backend="triton")
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "steps": args.steps, "sizes": {}}
    for n in (int(s) for s in args.sizes.split(",")):
        row = profile_size(llm, n, args.steps, args.top)
        report["sizes"][str(n)] = row
        print(f"N={n}: step {row['step_ms_median']:.3f} ms ({row['cprofile_step_ms_median']:.3f} under cProfile), "
              f"graph replay {row['graph_replay_ms']:.3f} ms, "
              f"host share {row['host_share']:.0%}\n{row['top_tottime']}")
    Path(args.out).write_text(json.dumps(report, indent=1), encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
