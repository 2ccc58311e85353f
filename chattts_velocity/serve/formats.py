"""Serving stage: response bytes — which formats this install can encode, the streamed WAV header, SSE events."""
from __future__ import annotations

import base64
import json
import struct
from collections.abc import AsyncIterator

from ..audio.wav import SAMPLE_RATE

MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg",
               "opus": "audio/ogg; codecs=opus"}
STREAMED = ("wav", "pcm")  # formats sent chunk by chunk; the others are encoded once the clip is complete


def available_formats() -> tuple[str, ...]:
    """wav and pcm always; flac / mp3 / opus when the installed libsndfile can encode them."""
    import soundfile as sf

    have = sf.available_formats()
    extra = [("flac", "FLAC", "PCM_16"), ("mp3", "MP3", "MPEG_LAYER_III"), ("opus", "OGG", "OPUS")]
    return ("wav", "pcm", *(fmt for fmt, c, sub in extra if c in have and sub in sf.available_subtypes(c)))


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
