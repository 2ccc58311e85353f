"""/metrics through prometheus_client: outcomes labelled by status, format and voice kind; engine and process
families; one registry per app (tiny random weights, in process)."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402 (after the importorskip above)

from chattts_velocity.serve import ServerConfig, create_app  # noqa: E402 (after the importorskip above)
from chattts_velocity.serve.metrics import DECODE_MAX_BATCH, ENGINE_METRICS, SPEECH_METRICS  # noqa: E402 (after the importorskip above)


def samples(client: TestClient, name: str) -> dict[str, float]:
    """label text -> value for every sample of `name` on /metrics."""
    page = client.get("/metrics").text
    return {m.group(1) or "": float(m.group(2))
            for m in re.finditer(rf"^{name}(?:\{{(.*)\}})? (\S+)$", page, re.MULTILINE)}


def speak(client: TestClient, **body) -> int:
    body = {"input": "Hello there.", "seed": 3, "max_new_tokens": 12, "response_format": "wav", **body}
    return client.post("/v1/audio/speech", json=body).status_code


def test_outcomes_are_labelled_by_status_format_and_voice_kind(client: TestClient) -> None:
    assert speak(client, voice="alloy", response_format="pcm") == 200
    assert speak(client, voice=7, response_format="wav") == 200
    assert speak(client, voice="alloy", temperature=-1) == 400
    assert client.post("/v1/audio/speech", content=b"{not json").status_code == 400
    seen = samples(client, SPEECH_METRICS["responses"].sample)
    assert seen['format="pcm",status="ok",voice_kind="preset"'] == 1
    assert seen['format="wav",status="ok",voice_kind="seed"'] == 1
    assert seen['format="wav",status="client_error",voice_kind="none"'] == 1  # refused before the voice was read
    assert seen['format="none",status="client_error",voice_kind="none"'] == 1  # not even JSON
    assert samples(client, SPEECH_METRICS["requests"].sample)[""] == 3  # the JSON-less body never reached the route
    assert samples(client, SPEECH_METRICS["audio_seconds"].sample)['format="pcm"'] > 0


def test_engine_and_process_families_are_read_at_scrape_time(client: TestClient) -> None:
    before = samples(client, ENGINE_METRICS["num_steps"].sample)[""]
    assert speak(client, min_new_tokens=12) == 200
    assert samples(client, ENGINE_METRICS["num_steps"].sample)[""] >= before + 12
    assert samples(client, ENGINE_METRICS["kv_blocks_used"].sample)[""] == 0
    assert samples(client, "process_resident_memory_bytes")[""] > 0
    assert samples(client, ENGINE_METRICS[DECODE_MAX_BATCH].sample)[""] >= 1


def test_each_app_counts_in_its_own_registry(client: TestClient, tiny_assets, tmp_path) -> None:
    pipeline = client.app.state.server.pipeline
    config = ServerConfig(voices_dir=str(tmp_path), warmup_steps=0, max_new_token=64)
    with TestClient(create_app(pipeline, config)) as other:
        assert samples(other, SPEECH_METRICS["requests"].sample)[""] == 0
        assert speak(other) == 200
        assert samples(other, SPEECH_METRICS["requests"].sample)[""] == 1
