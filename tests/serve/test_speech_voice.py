"""A speech request's voice on the server: its speaker string decoded once, and checked against the model only by
the pipeline's text front end (tiny random weights, in process)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402 (after the importorskip above)

from chattts_velocity import text  # noqa: E402 (after the importorskip above)
from chattts_velocity.text import speaker as speaker_module  # noqa: E402 (after the importorskip above)


def speak(client: TestClient, voice: object) -> dict:
    body = {"input": "One. Two. Three.", "voice": voice, "seed": 5, "max_new_tokens": 4, "response_format": "pcm"}
    response = client.post("/v1/audio/speech", json=body)
    return {"status": response.status_code, **(response.json().get("error", {}) if response.status_code >= 400
                                              else {})}


def test_a_speaker_string_is_decoded_once_per_request(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    speaker = client.app.state.server.pipeline.speakers.random(seed=918_273)  # a voice no other test decodes
    decoded, original = [], speaker_module.b14.decode_from_string
    monkeypatch.setattr(speaker_module.b14, "decode_from_string", lambda s: decoded.append(s) or original(s))
    assert speak(client, speaker)["status"] == 200  # three sentence pieces, one voice
    assert decoded == [speaker]  # recognised as a speaker string, checked by the front end: its bytes read once


def test_a_speaker_of_another_width_is_a_400_about_the_voice(client: TestClient) -> None:
    hidden = client.app.state.server.pipeline.config.hidden_size
    wrong = text.encode_spk_emb(torch.randn(hidden + 3))
    error = speak(client, wrong)
    assert error["status"] == 400 and error["param"] == "voice"
    assert f"has {hidden + 3} values but the model needs {hidden}" in error["message"]
    saved = client.post("/v1/audio/voices", json={"name": "too wide", "speaker": wrong})
    assert saved.status_code == 400 and saved.json()["error"]["param"] == "speaker"
