"""Benchmark: the speech WebSocket for voice agents. N sessions at once, each an LLM-like client that sends its reply
token by token; measured per session: first audio after the first sentence's last character (the time from sending
the text frame that completes the first sentence, its end mark's space included, to the first binary audio frame),
beside the HTTP streaming figure of the same first sentence (POST with stream: true, to its first audio byte), both
against one `chattts-velocity serve` process (loopback, pcm, forced steps per sentence), interleaved in one run.

    python -m benchmarks.bench_ws --model .pytest-assets/full --sizes 1,32 --steps 100        # run alone on the host
    python -m benchmarks.bench_ws --model .pytest-assets/tiny --dtype float32 --sizes 1,4 --steps 20 --repeats 1 \\
        --name smoke --json                                                                  # quick mode
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks import bench_serve

REPO = Path(__file__).resolve().parents[1]

RESULTS = REPO / "benchmarks" / "results"
FIRST = "Here is the answer you asked for. "  # the first sentence, sent token by token
REST = "It goes on for a while. And then it ends."
TOKEN_GAP_S = 0.02  # between two tokens of the simulated LLM (50 tokens/s)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parser().parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    rounds: dict[str, dict[int, list[dict[str, Any]]]] = {"ws": {n: [] for n in sizes}, "http": {n: [] for n in sizes}}
    with bench_serve._server(args) as url:
        asyncio.run(_ws_round(url, 1, args.steps))  # warm-up: first-shape costs
        for _ in range(args.repeats):  # interleaved, so a busy host slows both sides alike
            for n in sizes:
                rounds["ws"][n].append(asyncio.run(_ws_round(url, n, args.steps)))
                rounds["http"][n].append(asyncio.run(_http_round(url, n, args.steps)))
    report = {"model": args.model, "dtype": args.dtype, "steps": args.steps, "sizes": sizes, "repeats": args.repeats,
              "token_gap_s": TOKEN_GAP_S,
              **{side: {str(n): _median(runs) for n, runs in by_n.items()} for side, by_n in rounds.items()}}
    out = Path(args.out) / f"ws_{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    if args.json:
        print(json.dumps({side: report[side] for side in ("ws", "http")}))
    else:
        for n in sizes:
            ws, http = report["ws"][str(n)], report["http"][str(n)]
            print(f"N={n:<3} first audio after the sentence: ws {ws['first_audio_mean']:.3f} s (max "
                  f"{ws['first_audio_max']:.3f}), http {http['first_audio_mean']:.3f} s  ({out})")
    return report


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=".pytest-assets/full", help="asset folder (demo folders load unverified)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "int8"])
    p.add_argument("--sizes", default="1,32", help="concurrent sessions, comma-separated")
    p.add_argument("--steps", type=int, default=100, help="forced code steps per sentence")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (medians are reported)")
    p.add_argument("--port", type=int, default=0, help="the server's port (0: a free one)")
    p.add_argument("--name", default="cpu", help="results/ws_NAME.json")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--json", action="store_true", help="print both sides' figures as one JSON line")
    return p


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def _summary(firsts: list[float]) -> dict[str, Any]:
    return {"first_audio_mean": statistics.fmean(firsts), "first_audio_max": max(firsts)}


async def _ws_round(url: str, n: int, steps: int) -> dict[str, Any]:
    return _summary(list(await asyncio.gather(*(_ws_session(url, k, steps) for k in range(n)))))


async def _ws_session(url: str, seed: int, steps: int) -> float:
    """One agent: the reply token by token; seconds from the frame completing sentence 1 to its first audio."""
    from websockets.asyncio.client import connect

    config = {"type": "config", "voice": "alloy", "response_format": "pcm", "seed": seed,
              "max_new_tokens": steps, "min_new_tokens": steps}
    async with connect(url.replace("http", "ws", 1) + "/v1/audio/speech/ws", max_size=None) as ws:
        await ws.send(json.dumps(config))
        completed = 0.0
        for token in _tokens(FIRST):
            await asyncio.sleep(TOKEN_GAP_S)
            await ws.send(json.dumps({"type": "text", "text": token}))
            completed = time.perf_counter()  # the last token carries the end mark and its space
        first = None
        talker = asyncio.create_task(_send_rest(ws))
        async for message in ws:
            if isinstance(message, bytes) and first is None:
                first = time.perf_counter() - completed
            elif isinstance(message, str) and json.loads(message)["type"] == "error":
                raise SystemExit(f"error: the server refused a session: {message}")
        await talker
        return first if first is not None else float("nan")


async def _send_rest(ws: object) -> None:
    for token in _tokens(REST):
        await asyncio.sleep(TOKEN_GAP_S)
        await ws.send(json.dumps({"type": "text", "text": token}))  # type: ignore[attr-defined]
    await ws.send(json.dumps({"type": "close"}))  # type: ignore[attr-defined]


def _tokens(text: str) -> list[str]:
    """Word pieces as an LLM streams them: a word's leading space goes with it, long words split in two."""
    words = text.split(" ")
    tokens = [w if i == 0 else " " + w for i, w in enumerate(words)]
    pieces = [p for t in tokens for p in ((t[: len(t) // 2], t[len(t) // 2 :]) if len(t) > 6 else (t,)) if p]
    if text.endswith(" "):
        pieces[-2:] = [pieces[-2] + pieces[-1]]  # the end mark and the space that completes it arrive together
    return pieces


async def _http_round(url: str, n: int, steps: int) -> dict[str, Any]:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_connections=n + 1)) as client:
        return _summary(list(await asyncio.gather(*(_http_one(client, k, steps) for k in range(n)))))


async def _http_one(client: object, seed: int, steps: int) -> float:
    body = {"model": "tts-1", "input": FIRST, "voice": "alloy", "response_format": "pcm", "stream": True,
            "seed": seed, "max_new_tokens": steps, "min_new_tokens": steps}
    start, first = time.perf_counter(), None
    async with client.stream("POST", "/v1/audio/speech", json=body) as response:  # type: ignore[attr-defined]
        response.raise_for_status()
        async for _ in response.aiter_bytes():
            first = first if first is not None else time.perf_counter() - start
    return first if first is not None else float("nan")


if __name__ == "__main__":
    main()
