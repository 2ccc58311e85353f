"""Talk to `chattts-velocity serve` with the official OpenAI client; with --concurrency, measure time to first audio.

    chattts-velocity serve --model demo --port 8000 &
    python examples/openai_client.py --text "Hello there." --out hello.wav
    python examples/openai_client.py --concurrency 16 --max-new-tokens 300   # TTFA / wall time per request
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import openai

PCM_RATE = 24000  # the server's response_format "pcm": s16le mono at 24 kHz (this client needs only openai)


async def one(client: openai.AsyncOpenAI, args: argparse.Namespace, index: int) -> tuple[float, float, int]:
    """Stream one request as raw PCM; returns (time to first audio, total time, bytes of audio)."""
    extra = {"stream": True, "seed": args.seed + index}
    if args.max_new_tokens:
        extra["max_new_tokens"] = args.max_new_tokens
    start = time.perf_counter()
    first, size = None, 0
    async with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice=args.voice, input=args.text, response_format="pcm", extra_body=extra,
    ) as response:
        async for data in response.iter_bytes():
            if data and first is None:
                first = time.perf_counter() - start
            size += len(data)
    return first or float("nan"), time.perf_counter() - start, size


async def concurrent(args: argparse.Namespace) -> None:
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=3600)
    start = time.perf_counter()
    results = await asyncio.gather(*(one(client, args, i) for i in range(args.concurrency)))
    wall = time.perf_counter() - start
    ttfa = sorted(r[0] for r in results)
    audio = sum(r[2] for r in results) / 2 / PCM_RATE
    print(f"{args.concurrency} concurrent streams: time to first audio p50 {statistics.median(ttfa):.2f} s, "
          f"max {ttfa[-1]:.2f} s; {audio:.1f} s of audio in {wall:.1f} s wall ({audio / wall:.2f}x real time)")


def single(args: argparse.Namespace) -> None:
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=3600)
    extra = {"seed": args.seed} | ({"max_new_tokens": args.max_new_tokens} if args.max_new_tokens else {})
    start = time.perf_counter()
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice=args.voice, input=args.text, response_format=args.format,
        extra_body=extra | {"stream": True},
    ) as response:
        response.stream_to_file(args.out)
    print(f"wrote {args.out} in {time.perf_counter() - start:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="unused", help="the server's --api-key, if it has one")
    parser.add_argument("--text", default="Many users can share one engine, and the first audio comes fast.")
    parser.add_argument("--voice", default="alloy", help="preset name, integer seed or speaker string")
    parser.add_argument("--format", default="wav", choices=["wav", "pcm", "flac", "mp3", "opus"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=0, help="cap per sentence (random demo weights)")
    parser.add_argument("--out", default="speech.wav")
    parser.add_argument("--concurrency", type=int, default=0, help="N parallel streamed requests; print TTFA")
    args = parser.parse_args()
    if args.concurrency:
        asyncio.run(concurrent(args))
    else:
        single(args)


if __name__ == "__main__":
    main()
