"""Serving stage: a speech stream's float32 chunks -> encoded bytes as they are made (audio/encode.py's encoders),
for streamed responses of every format."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from ..audio.encode import open_encoder


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
