"""Every response format through the official `openai` client: streamed responses (the default) come in many pieces,
the first while the engine is still generating the request, with the format's Content-Type, and decode to the clip's
length; non-streamed ones (`stream: false`) decode to the same length."""
from __future__ import annotations

import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("av")

import test_openai_server as openai_server  # noqa: E402 (only once openai and av are known present)

from chattts_velocity.audio import SAMPLE_RATE, samples_for_steps  # noqa: E402 (after the importorskips)
from chattts_velocity.audio.formats import FORMATS  # noqa: E402 (after the importorskips)

pytestmark = pytest.mark.e2e

Server, speech_kwargs = openai_server.Server, openai_server.speech_kwargs
server, client = openai_server.server, openai_server.client  # the same server fixtures, registered here by name

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


def test_the_server_offers_every_openai_format(server: Server) -> None:
    assert set(OPENAI_FORMATS) <= set(server.state.formats)


def _steps_done(engine) -> int:
    """Steps the one running request has generated (STEPS once it has finished)."""
    running = list(engine.scheduler.running)
    return running[0].num_generated if running else STEPS


# What a decoder gets beyond the clip from a stream with no length header: the encoder's delay and last frame's
# padding, which the whole file's header (MP3's LAME tag, Opus's pre-skip and end granule) lets it trim.
STREAM_SLACK = {"mp3": 2 * 1152 + 576, "aac": 2 * 1024, "opus": 2 * 960}


@pytest.mark.parametrize("fmt", (*OPENAI_FORMATS, "ogg"))
def test_each_format_streams_through_the_openai_client(server: Server, client, fmt: str, decode_audio) -> None:
    engine = server.state.engine.engine
    kw = speech_kwargs(steps=STEPS, seed=7, response_format=fmt, extra={"min_new_tokens": STEPS})  # streamed: default
    pieces, steps_at_first_byte = [], None
    with client.audio.speech.with_streaming_response.create(**kw) as response:
        assert response.headers["content-type"] == FORMATS[fmt].media_type
        for piece in response.iter_bytes():
            if steps_at_first_byte is None:
                steps_at_first_byte = _steps_done(engine)
            pieces.append(piece)
    # the default stream's first chunk is due after 4 + 24 steps, the next 24 steps later: the first bytes must not
    # wait for the second (AAC's encoder delay may hold the first chunk's 1792 samples: it may take one more chunk)
    assert steps_at_first_byte < 4 + 24 + (48 if fmt == "aac" else 24), steps_at_first_byte
    assert len(pieces) >= 3
    streamed = b"".join(pieces)
    whole = client.audio.speech.create(**{**kw, "extra_body": {**kw["extra_body"], "stream": False}}).content
    streamed_samples, whole_samples = (_samples(data, fmt, decode_audio) for data in (streamed, whole))
    assert 0 <= streamed_samples - whole_samples <= STREAM_SLACK.get(fmt, 0), (streamed_samples, whole_samples)


def _samples(data: bytes, fmt: str, decode_audio) -> int:  # at 24 kHz (Opus decodes at 48 kHz)
    if fmt == "pcm":
        return len(data) // 2
    audio, rate = decode_audio(data)
    assert np.abs(audio).max() > 0
    return len(audio) * SAMPLE_RATE // rate


@pytest.mark.parametrize("fmt", OPENAI_FORMATS)
def test_each_format_non_streamed_decodes_to_the_clip_length(server: Server, client, fmt: str,
                                                             decode_audio) -> None:
    kw = speech_kwargs(steps=40, seed=8, response_format=fmt, extra={"min_new_tokens": 40, "stream": False})
    response = client.audio.speech.create(**kw)
    assert response.response.headers["content-type"] == FORMATS[fmt].media_type
    assert abs(_seconds(response.content, fmt, decode_audio) - _exact_seconds(40)) < 0.1
