"""A voice agent's side of the speech WebSocket: an LLM-like token stream piped in, the audio saved as it comes.

    chattts-velocity serve --model demo &
    python examples/ws_agent.py --url ws://127.0.0.1:8000/v1/audio/speech/ws -o reply.wav

`llm_tokens()` stands in for a real model's streamed reply (any generator of text pieces works: words may be split
anywhere). Tokens are sent as they come, while the audio of complete sentences already streams back; the reply is
saved as one WAV (each flush ends one file in the chosen format; this client flushes once, by closing). The
sentence.start / sentence.end frames are printed with their spans in the audio. Needs `pip install websockets`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Iterator

from websockets.asyncio.client import ClientConnection, connect


def llm_tokens() -> Iterator[str]:
    """A streamed reply, a few characters at a time (as an LLM's tokens arrive)."""
    reply = ("Sure, I can help with that. The first step is to open the settings page. "
             "Then choose the account tab, and press save when you are done. Anything else?")
    for start in range(0, len(reply), 4):
        yield reply[start : start + 4]


async def send_tokens(ws: ClientConnection, tokens: Iterator[str], gap_s: float) -> None:
    for token in tokens:
        await ws.send(json.dumps({"type": "text", "text": token}))
        await asyncio.sleep(gap_s)  # a real client sends when the LLM yields; here, a steady pace
    await ws.send(json.dumps({"type": "close"}))  # speak what is left, then the server closes the socket


async def main(args: argparse.Namespace) -> None:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    config = {"type": "config", "model": "tts-1", "voice": args.voice, "response_format": "wav", "seed": args.seed}
    started = time.perf_counter()
    async with connect(args.url, additional_headers=headers, max_size=None) as ws:
        await ws.send(json.dumps(config))
        sender = asyncio.create_task(send_tokens(ws, llm_tokens(), args.gap))
        with open(args.output, "wb") as out:
            async for message in ws:  # ends when the server closes after the last sentence
                if isinstance(message, bytes):
                    out.write(message)
                    continue
                event = json.loads(message)
                if event["type"] == "error":
                    raise SystemExit(f"error: {event['error']['message']}")
                print(f"{time.perf_counter() - started:6.2f} s  {json.dumps(event, ensure_ascii=False)}")
        await sender
    print(f"wrote {args.output}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="ws://127.0.0.1:8000/v1/audio/speech/ws")
    parser.add_argument("--voice", default="alloy", help="any voice the server takes, e.g. 'alloy(2)+1234(1)'")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gap", type=float, default=0.03, help="seconds between tokens")
    parser.add_argument("--api-key", default=os.environ.get("CHATTTS_VELOCITY_API_KEY"))
    parser.add_argument("-o", "--output", default="reply.wav")
    asyncio.run(main(parser.parse_args()))
