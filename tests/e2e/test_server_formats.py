"""Every response format through the official `openai` client: streamed responses come in many pieces, the first
while the engine is still generating the request, with the format's Content-Type, and decode to the clip's length;
non-streamed ones decode to the same length."""
from __future__ import annotations

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("av")

from test_openai_server import Server, client, server, speech_kwargs  # noqa: E402,F401 -- the same server fixtures

from chattts_velocity.audio import SAMPLE_RATE, samples_for_steps  # noqa: E402
from chattts_velocity.audio.formats import FORMATS  # noqa: E402

OPENAI_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
STEPS = 300  # long enough that a response's first bytes must come out before the engine finishes it


def _seconds(data: bytes, fmt: str, decode_audio) -> float:
    if fmt == "pcm":
        return len(data) / 2 / SAMPLE_RATE
    audio, rate = decode_audio(data)
    assert np.abs(audio).max() > 0  # sound, not an empty or silent container
    return len(audio) / rate


def _exact_seconds(steps: int) -> float:
    return samples_for_steps(steps) / SAMPLE_RATE  # min_new_tokens = max_new_tokens: exactly `steps` steps


@pytest.mark.e2e
def test_the_server_offers_every_openai_format(server: Server) -> None:
    assert set(OPENAI_FORMATS) <= set(server.state.formats)


@pytest.mark.e2e
@pytest.mark.parametrize("fmt", (*OPENAI_FORMATS, "ogg"))
def test_each_format_streams_through_the_openai_client(server: Server, client, fmt: str, decode_audio) -> None:
    engine = server.state.engine.engine
    kw = speech_kwargs(steps=STEPS, seed=7, response_format=fmt, extra={"min_new_tokens": STEPS, "stream": True})
    pieces, generating_at_first_byte = [], None
    with client.audio.speech.with_streaming_response.create(**kw) as response:
        assert response.headers["content-type"] == FORMATS[fmt].media_type
        for piece in response.iter_bytes():
            if generating_at_first_byte is None:
                generating_at_first_byte = engine.has_unfinished_requests()
            pieces.append(piece)
    assert generating_at_first_byte, "the first bytes came only after the whole clip was generated"
    assert len(pieces) >= 3
    assert abs(_seconds(b"".join(pieces), fmt, decode_audio) - _exact_seconds(STEPS)) < 0.1


@pytest.mark.e2e
@pytest.mark.parametrize("fmt", OPENAI_FORMATS)
def test_each_format_non_streamed_decodes_to_the_clip_length(server: Server, client, fmt: str,
                                                             decode_audio) -> None:
    kw = speech_kwargs(steps=40, seed=8, response_format=fmt, extra={"min_new_tokens": 40})
    response = client.audio.speech.create(**kw)
    assert response.response.headers["content-type"] == FORMATS[fmt].media_type
    assert abs(_seconds(response.content, fmt, decode_audio) - _exact_seconds(40)) < 0.1
