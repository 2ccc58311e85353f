"""Serving stage: a speech stream's float32 chunks -> encoded bytes as they are made (audio/encode.py's encoders),
for streamed responses of every format, and the response that sends them."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import numpy as np
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..audio.encode import open_encoder


class StreamedAudio(StreamingResponse):
    """A StreamingResponse that calls `on_close` when it ends, however it ends: a send that failed or timed out
    (serve/edge.py's send timeout) leaves the generators it was reading suspended until they are collected, so the
    speech stream is closed here, at once (its pieces aborted, their KV blocks freed)."""

    def __init__(self, content: AsyncIterator[bytes] | AsyncIterator[str], on_close: Callable[[], None],
                 media_type: str) -> None:
        super().__init__(content, media_type=media_type)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


async def encoded_chunks(chunks: AsyncIterator[np.ndarray], fmt: str) -> AsyncIterator[bytes]:
    """Each chunk's encoded bytes once the muxer has them (encoding runs off the event loop), then the tail.

    One encoder per response; a chunk whose bytes the codec still holds (frame or Ogg page boundaries) yields
    nothing, so every non-empty item is ready to send."""
    encoder = open_encoder(fmt)
    async for chunk in chunks:
        data = await asyncio.to_thread(encoder.encode, chunk)
        if data:
            yield data
    tail = await asyncio.to_thread(encoder.flush)
    if tail:
        yield tail
