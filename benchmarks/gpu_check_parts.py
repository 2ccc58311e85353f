"""The GPU check's measurements (benchmarks/gpu_check.py writes them into one JSON); each runs on CUDA or, tiny and
short, on a CPU (the dry run the default suite runs).

Steady decode is timed over engine.step() calls once every request has its first token and `warm` more steps
(prefill and warm-up excluded, no profiler attached); end to end is submission to the last token, prefill included.
Prompts have a TTS request's length (`prompt_rows`: 100 to 300 positions on a GPU), so with the warm-up the timed
steps run at contexts of ~300 to ~600 positions (`steady_decode` reports the range it saw).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from chattts_velocity.config import EngineConfig
from chattts_velocity.engine.worker.step_inputs import PagedKV, StepTensors
from chattts_velocity.schema import Prompt, SamplingParams

OVERLAP_OPTIONS = ("async_scheduling", "overlap_scheduling", "overlap")  # the engine option, by any of its names
PROMPT_POSITIONS = (100, 300)  # a TTS request's prompt: text and speaker rows
SAMPLE_RATE, HOP = 24_000, 256
# HBM bandwidth by card name (TB/s); another card's is measured with a large device copy
BANDWIDTH_TBS = {"H100 80GB HBM3": 3.35, "H100 SXM": 3.35, "H200": 4.8}
GEMM_ROWS = (1, 16, 64, 256)


def overlap_option() -> str | None:
    """The EngineConfig field that turns on the overlapped (host a step ahead) loop, or None if the engine has none."""
    names = {f.name for f in dataclasses.fields(EngineConfig)}
    return next((name for name in OVERLAP_OPTIONS if name in names), None)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prompt_rows(i: int, positions: tuple[int, int] | None = None) -> int:
    """Request i's prompt length: spread evenly over [low, high] (default PROMPT_POSITIONS, read at the call: the
    dry run sets a tiny model's)."""
    low, high = positions or PROMPT_POSITIONS
    return low + (i * 37) % (high - low + 1)


def prompt(engine, i: int, positions: tuple[int, int] | None = None) -> Prompt:
    rows = prompt_rows(i, positions)
    ids = torch.full((rows, engine.config.num_vq), 7 + i % 50, dtype=torch.int64)
    return Prompt(ids, torch.zeros(rows, dtype=torch.bool))


def forced(steps: int, seed: int, **kw) -> SamplingParams:
    return SamplingParams(max_new_token=steps, min_new_token=steps, seed=seed, **kw)


def steady_decode(engine, n: int, warm: int, steps: int, positions: tuple[int, int] | None = None) -> dict:
    """n forced requests at once: steady sequence-steps/s (timed steps only) and end to end (submission to finish);
    `contexts`: the shortest context when timing starts and the longest when it ends."""
    device = engine.runner.device
    total = warm + steps + 8  # requests admitted in an earlier prefill chunk are a few steps ahead
    start = time.perf_counter()
    rids = [engine.add_request(f"steady{n}-{i}", prompt(engine, i, positions), forced(total, i)) for i in range(n)]
    started: set[str] = set()
    widest = 0
    while len(started) < n:  # prefill (maybe chunked) until every request has its first token
        started |= {o.request_id for o in engine.step() if len(o.token_ids)}
        widest = max(widest, engine.stats.last_batch_size)
    for _ in range(warm):
        engine.step()
    sync(device)
    first = _contexts(engine, rids)
    walls = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - t0)
        widest = max(widest, engine.stats.last_batch_size)
    sync(device)
    last = _contexts(engine, rids)
    while engine.has_unfinished_requests():
        engine.step()
    end_to_end = time.perf_counter() - start
    return {"steady_steps_per_s": n * steps / sum(walls), "step_ms_median": 1e3 * statistics.median(walls),
            "end_to_end_steps_per_s": n * total / end_to_end, "max_concurrent": widest,
            "contexts": [min(first, default=0), max(last, default=0)]}


def _contexts(engine, rids: list[str]) -> list[int]:
    """The running sequences' lengths (positions), those of `rids` only."""
    wanted = set(rids)
    return [len(seq) for seq in engine.scheduler.running if seq.request_id in wanted]


def drain(engine) -> None:
    """Abort whatever a part left running or waiting (a part cut short by its time limit), then step until idle."""
    for seq in [*engine.scheduler.running, *engine.scheduler.waiting]:
        engine.abort_request(seq.request_id)
    while engine.has_unfinished_requests():
        engine.step()


def paged_kv(runner) -> PagedKV:
    """The engine's KV pool as a backend sees it (its last block is the pad block)."""
    return PagedKV(runner.kv_cache, runner.block_size, pad_block=runner.kv_cache[0][0].shape[0] - 1,
                   device=runner.device)


def replay_ms(backend, kv: PagedKV, n: int, context: int, repeats: int) -> float:
    """Median time of one decode of the layers for n rows at `context` positions (CUDA events on a GPU)."""
    per_seq = -(-context // kv.block_size)
    tables = [[(i * per_seq + j) % kv.pad_block for j in range(per_seq)] for i in range(n)]
    step = StepTensors.from_lists([1] * n, [context] * n, tables, kv.block_size, kv.device)
    x = torch.randn(n, kv.pairs[0][0].shape[-2] * kv.pairs[0][0].shape[-1], device=kv.device,
                    dtype=kv.pairs[0][0].dtype)  # [n, heads x head_dim] = [n, H]
    times = []
    with torch.inference_mode():
        backend.run(x, step)  # warm-up
        for _ in range(repeats):
            times.append(_timed(lambda: backend.run(x, step), kv.device))
    return statistics.median(times)


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - t0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def kernels_per_step(engine, n: int, steps: int) -> tuple[float | None, str]:
    """Kernels a decode step of n sequences runs: torch.profiler's CUDA kernels on a GPU (graph replays included),
    launches counted by LaunchCounter on a CPU."""
    device = engine.runner.device
    ids = [engine.add_request(f"kern{n}-{i}", prompt(engine, i), forced(steps + 8, i)) for i in range(n)]
    for _ in range(4):
        engine.step()
    sync(device)
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                engine.step()
            sync(device)
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and not e.name.startswith(("Memcpy", "Memset"))]
        count, how = len(kernels), "torch.profiler (CUDA kernels)"
        if not kernels:  # a profiler that does not see kernels inside graph replays: no figure, not a zero
            count, how = None, "torch.profiler saw no kernels"
    else:
        from chattts_velocity.devtools.launch_counter import LaunchCounter

        with LaunchCounter() as launches:
            for _ in range(steps):
                engine.step()
        count, how = launches.count, "LaunchCounter (launches on CPU)"
    for rid in ids:
        engine.abort_request(rid)
    return None if count is None else count / steps, how


def codes(engine, requests: dict[str, tuple[Prompt, SamplingParams]]) -> dict[str, torch.Tensor]:
    """Each request's codes [T, 4], all submitted at once and run to the end."""
    got: dict[str, list[torch.Tensor]] = {rid: [] for rid in requests}
    for rid, (p, params) in requests.items():
        engine.add_request(rid, p, params)
    while engine.has_unfinished_requests():
        for o in engine.step():
            got[o.request_id].append(o.token_ids.cpu())
    return {rid: torch.cat(parts) if parts else torch.zeros(0, 4, dtype=torch.long) for rid, parts in got.items()}


def invariant_alone_vs_others(engine, others: int, steps: int) -> bool:
    """A seeded request (default sampling) gives bit-identical codes alone and among `others` other requests."""
    mine = (prompt(engine, 0), forced(steps, seed=1234))
    alone = codes(engine, {"alone": mine})["alone"]
    crowd = {f"other{i}": (prompt(engine, i + 1), forced(max(steps - i % 7, 1), seed=i)) for i in range(others)}
    among = codes(engine, {"among": mine, **crowd})["among"]
    return alone.shape == among.shape and bool(torch.equal(alone, among))


def streaming_clients(engine, mel, n: int, steps: int) -> dict:
    """n clients streamed as the server streams them (StreamSet, default StreamOptions): aggregate seconds of audio
    per wall second and each client's time to first audio."""
    from chattts_velocity.speech import StreamSet

    streams = StreamSet()
    index = {}
    for k in range(n):
        streams.open(k, mel)
    samples, first = [0] * n, {}
    start = time.perf_counter()
    for k in range(n):
        index[engine.add_request(f"stream{n}-{k}", prompt(engine, k), forced(steps, k))] = k
    while engine.has_unfinished_requests():
        deltas = [(index[d.request_id], d) for d in engine.step()]
        with torch.inference_mode():
            out = streams.push({k: mel.rows(d) for k, d in deltas if len(d.token_ids)})
            out.update({k: np.concatenate([out.get(k, np.zeros(0, np.float32)), chunk])
                        for k, chunk in streams.finish([k for k, d in deltas if d.finished]).items()})
        now = time.perf_counter() - start
        for k, chunk in out.items():
            samples[k] += len(chunk)
            if len(chunk):
                first.setdefault(k, now)
    wall = time.perf_counter() - start
    return {"audio_s_per_s": sum(samples) / SAMPLE_RATE / wall, "ttfa_s": max(first.values()),
            "ttfa_median_s": statistics.median(first.values()), "wall_s": wall,
            "complete": all(s == (2 * steps - 1) * HOP for s in samples)}


def bandwidth_tbs(device: torch.device) -> tuple[float, str]:
    """The card's HBM bandwidth in TB/s and where it comes from: its name (H100 SXM 3.35, H200 4.8), else a
    1 GiB device-to-device copy (read + write) timed with CUDA events; on a CPU the same copy in host memory."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    for key, tbs in BANDWIDTH_TBS.items():
        if key in name:
            return tbs, f"card name ({name})"
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    ms = statistics.median(_timed(lambda: dst.copy_(src), device) for _ in range(5))
    return 2 * src.numel() / (ms * 1e-3) / 1e12, "measured: 1 GiB device copy"


def layer_gemms(device: torch.device, hidden: int = 768, inter: int = 3072, heads: int = 12, head_dim: int = 64):
    """name -> (weight bytes, call(M) -> a callable running that layer GEMM at M rows, default tiles, bf16)."""
    from chattts_velocity.model.kernels.triton import gemm, qkv

    def w(n: int, k: int) -> torch.Tensor:
        return torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02

    weights = {"qkv": w(3 * hidden, hidden), "o": w(hidden, hidden), "gate_up": w(2 * inter, hidden),
               "down": w(hidden, inter)}
    norm = torch.ones(hidden, device=device, dtype=torch.bfloat16)
    pool = torch.zeros(64, 16, heads, head_dim, device=device, dtype=torch.bfloat16)
    cos, sin = torch.ones(4096, head_dim, device=device), torch.zeros(4096, head_dim, device=device)

    def call(name: str, m: int) -> Callable[[], object]:
        weight = weights[name]
        x = torch.randn(m, weight.shape[1], device=device, dtype=torch.bfloat16)
        if name == "qkv":
            pos = torch.arange(m, device=device)
            return lambda: qkv.norm_qkv_rope(x, norm, weight, pos, pos % (64 * 16), cos, sin, pool, pool, 1e-6)
        if name == "gate_up":
            return lambda: gemm.norm_gate_up(x, norm, weight, 1e-6)
        residual = torch.randn(m, weight.shape[0], device=device, dtype=torch.bfloat16)
        return lambda: gemm.residual_linear(x, weight, residual)

    return {name: t.numel() * t.element_size() for name, t in weights.items()}, call


def gemm_tbs(device: torch.device, rows: tuple[int, ...] = GEMM_ROWS, repeats: int = 25,
             shape: tuple[int, int, int, int] = (768, 3072, 12, 64)) -> dict:
    """name -> {M: achieved TB/s} for each layer GEMM (shape: hidden, intermediate, heads, head_dim): its weight's
    bytes over its median time (CUDA events, the weights read from HBM: a 256 MB write between runs flushes L2; on
    a CPU, wall time)."""
    sizes, call = layer_gemms(device, *shape)
    flush = torch.empty(256 << 20 if device.type == "cuda" else 1 << 20, dtype=torch.uint8, device=device)
    out: dict = {}
    for name, nbytes in sizes.items():
        out[name] = {}
        for m in rows:
            run = call(name, m)
            run()  # compile
            times = []
            for _ in range(repeats):
                flush.zero_()
                times.append(_timed(run, device))
            out[name][str(m)] = round(nbytes / (statistics.median(times) * 1e-3) / 1e12, 4)
    return out


def hbm_fraction(tbs: dict, bandwidth: float, m: int) -> float:
    """The slowest layer GEMM's achieved fraction of the card's bandwidth at M rows."""
    return round(min(per_m[str(m)] for per_m in tbs.values()) / bandwidth, 4)
