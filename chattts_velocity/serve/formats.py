"""Serving stage: HTTP streaming helpers — the streamed WAV header and SSE events (the formats: audio/formats.py)."""
from __future__ import annotations

import base64
import json
import struct
from collections.abc import AsyncIterator

from ..audio.wav import SAMPLE_RATE


def streaming_wav_header(sample_rate: int = SAMPLE_RATE) -> bytes:
    """A 16-bit mono WAV header whose RIFF and data sizes are 0xFFFFFFFF (unknown length, as streamed)."""
    unknown = 0xFFFFFFFF
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", unknown) + b"WAVEfmt " + struct.pack("<I", 16) + fmt + b"data" + \
        struct.pack("<I", unknown)


async def sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """OpenAI's SSE variant: speech.audio.delta events (base64 audio), then speech.audio.done."""
    try:
        async for data in chunks:
            yield f"data: {json.dumps({'type': 'speech.audio.delta', 'audio': base64.b64encode(data).decode()})}\n\n"
    except Exception as exc:  # noqa: BLE001 -- the status line is already sent; report in band
        yield f"data: {json.dumps({'type': 'speech.audio.error', 'error': {'message': str(exc)}})}\n\n"
        return
    yield f"data: {json.dumps({'type': 'speech.audio.done'})}\n\n"
