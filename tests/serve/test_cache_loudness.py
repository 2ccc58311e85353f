"""The audio cache of seeded requests and loudness normalisation: the LRU itself, pyloudnorm's measure of the
result, and both through the app (tiny random weights, in process)."""
from __future__ import annotations

import io
import re
import wave

import numpy as np
import pytest

pytest.importorskip("fastapi")
pyloudnorm = pytest.importorskip("pyloudnorm")

from fastapi.testclient import TestClient  # noqa: E402 (after the importorskip above)

from chattts_velocity.audio.loudness import check_loudness, normalize_loudness  # noqa: E402 (after the importorskip above)
from chattts_velocity.serve.cache import AudioCache  # noqa: E402 (after the importorskip above)
from chattts_velocity.serve.metrics import SPEECH_METRICS  # noqa: E402 (after the importorskip above)


def test_the_cache_keeps_the_most_recent_within_its_budget() -> None:
    cache = AudioCache(budget_bytes=10)
    cache.put("a", b"1234")
    cache.put("b", b"5678")
    assert cache.get("a") == b"1234"  # a is now the most recent
    cache.put("c", b"90ab")  # 12 bytes: b, the least recent, leaves
    assert (cache.get("b"), cache.get("a"), cache.get("c")) == (None, b"1234", b"90ab") and cache.used == 8
    cache.put("big", b"x" * 11)  # larger than the whole budget: not kept, nothing evicted
    assert cache.get("big") is None and len(cache) == 2
    assert cache.get(None) is None


def speech(rate: int = 24000, seconds: float = 3.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.05 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)


@pytest.mark.parametrize("target", [-30.0, -23.0, -16.0])
def test_normalised_clips_measure_the_target(target: float) -> None:
    out = normalize_loudness(speech(), target)
    assert pyloudnorm.Meter(24000).integrated_loudness(out.astype(np.float64)) == pytest.approx(target, abs=0.5)


def test_loudness_never_clips_and_leaves_silence_alone() -> None:
    loud = normalize_loudness(speech(), -5.0)
    assert np.abs(loud).max() <= 0.999 + 1e-6
    silent = np.zeros(24000, np.float32)
    assert normalize_loudness(silent, -16.0) is silent
    for bad in (float("nan"), -80, 0, True, "loud"):
        with pytest.raises(ValueError, match="^loudness:"):
            check_loudness(bad)


def post(client: TestClient, **body):
    body = {"input": "Hello there, this is a test.", "max_new_tokens": 40, "min_new_tokens": 40,
            "response_format": "wav", **body}
    return client.post("/v1/audio/speech", json=body)


def lookups(client: TestClient) -> dict[str, float]:
    page = client.get("/metrics").text
    return {m[0]: float(m[1]) for m in re.findall(rf'^{SPEECH_METRICS["cache"].sample}\{{result="(\w+)"\}} (\S+)$',
                                                  page, re.MULTILINE)}


def test_a_repeated_seeded_request_is_a_hit_with_the_same_bytes(client: TestClient) -> None:
    first = post(client, seed=11, stream=False)
    steps = client.app.state.server.engine.metrics()["num_steps"]
    again = post(client, seed=11, stream=False)
    assert first.status_code == again.status_code == 200 and first.content == again.content
    assert client.app.state.server.engine.metrics()["num_steps"] == steps  # the repeat ran no model step
    streamed = post(client, seed=11)  # streamed (the default) bytes are their own entry: a WAV of unknown length
    assert streamed.content[44:] == first.content[44:] and streamed.content[:44] != first.content[:44]
    assert post(client, seed=11, stream=True).content == streamed.content  # and they repeat, asked for or not
    assert post(client, seed=12).content != first.content  # another seed: a miss
    assert lookups(client) == {"miss": 3, "hit": 2}


def test_unseeded_requests_are_never_cached(client: TestClient) -> None:
    before = len(client.app.state.server.cache)
    assert post(client).status_code == 200 and post(client).status_code == 200
    assert len(client.app.state.server.cache) == before


def test_loudness_through_the_server(client: TestClient) -> None:
    response = post(client, seed=3, loudness=-20)  # loudness needs the whole clip: not streamed by default
    assert response.status_code == 200, response.text
    with wave.open(io.BytesIO(response.content)) as w:
        assert w.getnframes() * 2 + 44 == len(response.content)  # the exact length in the header
        audio = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float64) / 32768
    assert pyloudnorm.Meter(24000).integrated_loudness(audio) == pytest.approx(-20, abs=0.5)
    for body in ({"loudness": -20, "stream": True}, {"loudness": -20, "stream_format": "sse"}, {"loudness": 3}):
        refused = post(client, seed=3, **body)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "loudness"
