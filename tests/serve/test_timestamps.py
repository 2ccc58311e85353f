"""Sentence timestamps: the Timeline arithmetic, and the server's speech.audio.timestamp SSE events (tiny weights)."""
from __future__ import annotations

import base64
import json
from itertools import pairwise

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402 (after the importorskip above)

from chattts_velocity.audio.timestamps import Timestamp, piece_timestamps  # noqa: E402 (after the importorskip above)


def test_pieces_follow_each_other_without_gaps() -> None:
    stamps = piece_timestamps(["a", "b", "c"], [24000, 12000, 0], sample_rate=24000)
    assert stamps == [Timestamp("a", 0.0, 1.0), Timestamp("b", 1.0, 1.5), Timestamp("c", 1.5, 1.5)]
    with pytest.raises(ValueError):
        piece_timestamps(["a"], [1, 2])


TEXT = "The first sentence is here. And then comes the second one! Is there a third?"


def events(client: TestClient, **body) -> list[dict]:
    body = {"input": TEXT, "seed": 5, "max_new_tokens": 60,
            "min_new_tokens": 60, "response_format": "pcm", "stream_format": "sse", **body}
    response = client.post("/v1/audio/speech", json=body)
    assert response.status_code == 200, response.text
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]


def test_sse_carries_one_timestamp_per_sentence_piece_in_the_audio(client: TestClient) -> None:
    got = events(client, timestamps=True)
    audio = b"".join(base64.b64decode(e["audio"]) for e in got if e["type"] == "speech.audio.delta")
    stamps = [e for e in got if e["type"] == "speech.audio.timestamp"]
    assert got[-1]["type"] == "speech.audio.done"
    pieces = client.app.state.server.service.pieces(TEXT).texts
    assert len(pieces) > 1 and [s["text"] for s in stamps] == list(pieces)
    assert stamps[0]["start"] == 0 and all(s["end"] > s["start"] for s in stamps)
    assert all(a["end"] == b["start"] for a, b in pairwise(stamps))
    assert stamps[-1]["end"] == pytest.approx(len(audio) / 2 / 24000, abs=1e-4)
    first_stamp = next(i for i, e in enumerate(got) if e["type"] == "speech.audio.timestamp")
    assert any(e["type"] == "speech.audio.delta" for e in got[first_stamp:])  # sent as pieces finish, not at the end


def test_timestamps_are_opt_in_and_need_sse(client: TestClient) -> None:
    assert not [e for e in events(client) if e["type"] == "speech.audio.timestamp"]
    response = client.post("/v1/audio/speech", json={"input": "Hi.", "timestamps": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "timestamps"
