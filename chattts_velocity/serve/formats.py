"""Serving stage: SSE events of a streamed response (the formats: audio/formats.py, their encoders: audio/encode.py)."""
from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator


async def sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[str]:
    """OpenAI's SSE variant: speech.audio.delta events (base64 audio), then speech.audio.done."""
    try:
        async for data in chunks:
            yield f"data: {json.dumps({'type': 'speech.audio.delta', 'audio': base64.b64encode(data).decode()})}\n\n"
    except Exception as exc:  # noqa: BLE001 -- the status line is already sent; report in band
        yield f"data: {json.dumps({'type': 'speech.audio.error', 'error': {'message': str(exc)}})}\n\n"
        return
    yield f"data: {json.dumps({'type': 'speech.audio.done'})}\n\n"
