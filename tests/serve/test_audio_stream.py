"""A streamed response's bytes: each format's first bytes are handed on before the second audio chunk is asked
for (time to first byte = wav's, in chunks), and the pieces join into the whole-clip encoding's audio."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("fastapi")

from chattts_velocity.audio import float_to_int16  # noqa: E402 (after the importorskip above)
from chattts_velocity.audio.formats import available_formats  # noqa: E402 (after the importorskip above)
from chattts_velocity.serve.audio_stream import encoded_chunks  # noqa: E402 (after the importorskip above)

CHUNKS = [(0.3 * np.sin(np.arange(k * 4800, (k + 1) * 4800) / 7.0)).astype(np.float32) for k in range(6)]


async def _first_bytes_and_rest(fmt: str) -> tuple[int, list[bytes]]:
    pulled = 0

    async def made() -> object:
        nonlocal pulled
        for chunk in CHUNKS:
            pulled += 1
            yield chunk

    pieces, pulled_at_first = [], None
    async for data in encoded_chunks(made(), fmt):
        pulled_at_first = pulled if pulled_at_first is None else pulled_at_first
        pieces.append(data)
    return pulled_at_first, pieces


@pytest.mark.parametrize("fmt", available_formats())
def test_first_bytes_leave_before_the_second_chunk_is_asked_for(fmt: str) -> None:
    pulled_at_first, pieces = asyncio.run(_first_bytes_and_rest(fmt))
    assert pulled_at_first == 1 and all(pieces)  # empty pieces are never yielded
    assert len(pieces) >= len(CHUNKS) - 1


def test_streamed_pcm_is_the_int16_of_every_chunk() -> None:
    _, pieces = asyncio.run(_first_bytes_and_rest("pcm"))
    assert b"".join(pieces) == float_to_int16(np.concatenate(CHUNKS)).astype("<i2").tobytes()
