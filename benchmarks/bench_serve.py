"""Benchmark: the server's tax. N concurrent streamed requests through `chattts-velocity serve` (its own process,
loopback HTTP, pcm) against the same N forced-length requests on the engine alone: the server's own engine and
decode thread (SpeechService on an AsyncLLMEngine) in this process, without HTTP, JSON or encoding. Same model,
precision, stream options and steps, interleaved in one run.

Reported per N: audio seconds per wall second and mean time to first audio on each side, and their ratios
(server / engine: 1.0 = no tax). Usage (from a checkout; run it alone on the machine):

    python -m benchmarks.bench_serve --model .pytest-assets/full --sizes 1,16,64 --steps 100
    python -m benchmarks.bench_serve --model .pytest-assets/tiny --sizes 1,4 --steps 30 --json   # smoke run
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.lib import runs
from chattts_velocity import Chat, InferCodeParams
from chattts_velocity.audio import SAMPLE_RATE
from chattts_velocity.engine.async_engine import AsyncLLMEngine
from chattts_velocity.serve.service import SpeechService
from chattts_velocity.speech import StreamOptions

REPO = Path(__file__).resolve().parents[1]

RESULTS = REPO / "benchmarks" / "results"


def main(argv: list[str] | None = None) -> dict:
    args = _parser().parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    with _service(args) as service, _server(args) as url:
        for _ in range(2):  # warm-up: first-shape costs on both sides
            asyncio.run(_round(url, 1, args.steps))
            asyncio.run(_engine_round(service, 1, args.steps))
        rounds = {"server": {n: [] for n in sizes}, "engine": {n: [] for n in sizes}}
        for _ in range(args.repeats):  # interleaved, so a busy host slows both sides alike
            for n in sizes:
                rounds["server"][n].append(asyncio.run(_round(url, n, args.steps)))
                rounds["engine"][n].append(asyncio.run(_engine_round(service, n, args.steps)))
    report = {"model": args.model, "dtype": args.dtype, "steps": args.steps, "sizes": sizes, "repeats": args.repeats,
              **{side: {str(n): _median(runs) for n, runs in by_n.items()} for side, by_n in rounds.items()}}
    report["ratios"] = {str(n): _ratios(report["server"][str(n)], report["engine"][str(n)]) for n in sizes}
    out = Path(args.out) / f"serve_{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    if args.json:
        print(json.dumps(report["ratios"]))
    else:
        for n, r in report["ratios"].items():
            print(f"N={n:<3} server/engine audio s/s {r['throughput']:.3f}, TTFA {r['ttfa']:.3f}  ({out})")
    return report


def _median(runs: list[dict]) -> dict:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=".pytest-assets/full", help="asset folder (demo folders load unverified)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "int8"])
    p.add_argument("--sizes", default="1,16,64", help="concurrent requests, comma-separated")
    p.add_argument("--steps", type=int, default=100, help="forced code steps per request")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (medians are reported)")
    p.add_argument("--port", type=int, default=0, help="the server's port (0: a free one)")
    p.add_argument("--name", default="cpu", help="results/serve_NAME.json")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--json", action="store_true", help="print the ratios as one JSON line")
    return p


def _ratios(server: dict, engine: dict) -> dict:
    return {"throughput": server["audio_s_per_s"] / engine["audio_s_per_s"],
            "ttfa": server["ttfa_mean"] / engine["ttfa_mean"]}


@contextlib.contextmanager
def _service(args: argparse.Namespace) -> Iterator[SpeechService]:
    """The server's own engine + decode thread (SpeechService on an AsyncLLMEngine), in this process, no HTTP."""
    chat = Chat()
    chat.load(source="custom", custom_path=args.model, verify=False, use_vllm=True, dtype=args.dtype)
    engine = AsyncLLMEngine(chat.engine())
    service = SpeechService(chat.pipeline, engine, StreamOptions())
    engine.start()
    try:
        yield service
    finally:
        engine.shutdown()
        service.shutdown()


async def _engine_round(service: SpeechService, n: int, steps: int) -> dict:
    start = time.perf_counter()
    results = await asyncio.gather(*(_one_in_process(service, text, k, steps, start)
                                     for k, text in enumerate(runs.texts(n))))
    return _summary(results, time.perf_counter() - start)


async def _one_in_process(service: SpeechService, text: str, seed: int, steps: int, start: float) -> tuple[float, int]:
    params = InferCodeParams(manual_seed=seed, max_new_token=steps, min_new_token=steps, show_tqdm=False)
    stream = await service.open(text, params)
    first, samples = None, 0
    async for chunk in stream:
        first = first if first is not None else time.perf_counter() - start
        samples += len(chunk)
    return first if first is not None else float("nan"), 2 * samples  # bytes of s16 pcm, as the server sends


def _summary(results: list[tuple[float, int]], wall: float) -> dict:
    ttfa = [first for first, _ in results]
    samples = sum(size // 2 for _, size in results)
    return {"wall_s": wall, "ttfa_mean": statistics.fmean(ttfa), "ttfa_max": max(ttfa),
            "audio_s_per_s": samples / SAMPLE_RATE / wall}


@contextlib.contextmanager
def _server(args: argparse.Namespace) -> Iterator[str]:
    port = args.port or _free_port()
    command = [sys.executable, "-m", "chattts_velocity.cli", "serve", "--model", args.model, "--dtype", args.dtype,
               "--port", str(port), "--cache-mb", "0", "--max-new-token", str(args.steps)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    server = subprocess.Popen(command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, server)
        yield url
    finally:
        server.terminate()
        server.wait(60)


async def _round(url: str, n: int, steps: int) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=n + 1)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(_one(client, text, k, steps, start)
                                         for k, text in enumerate(runs.texts(n))))
        return _summary(results, time.perf_counter() - start)


async def _one(client, text: str, seed: int, steps: int, start: float) -> tuple[float, int]:
    body = {"model": "tts-1", "input": text, "voice": "alloy", "response_format": "pcm", "stream": True,
            "seed": seed, "max_new_tokens": steps, "min_new_tokens": steps}
    first, size = None, 0
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:
        response.raise_for_status()
        async for piece in response.aiter_bytes():
            first = first if first is not None else time.perf_counter() - start
            size += len(piece)
    return first if first is not None else float("nan"), size


def _wait_healthy(url: str, server: subprocess.Popen, timeout: float = 600) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"error: the server exited with {server.returncode} before answering /health")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"error: the server did not answer /health within {timeout:.0f} s")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
