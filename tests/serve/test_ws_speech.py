"""The speech WebSocket in process (tiny weights, starlette's test client): sentence frames in order around their
audio, each flush ending one file in the format, text after a flush going on, refusals in OpenAI's shape."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402 (after the importorskip above)

CONFIG = {"type": "config", "voice": "echo", "response_format": "wav", "seed": 2, "max_new_tokens": 8,
          "min_new_tokens": 8}


def until_done(ws) -> tuple[list[dict], bytes]:
    events, audio = [], b""
    while True:
        message = ws.receive()
        if message.get("bytes") is not None:
            audio += message["bytes"]
            continue
        events.append(json.loads(message["text"]))
        if events[-1]["type"] in ("done", "error"):
            return events, audio


def test_each_flush_ends_one_file_and_the_session_goes_on(client: TestClient) -> None:
    with client.websocket_connect("/v1/audio/speech/ws") as ws:
        ws.send_text(json.dumps(CONFIG))
        for delta in ("One. Tw", "o. Thr", "ee"):
            ws.send_text(json.dumps({"type": "text", "text": delta}))
        ws.send_text(json.dumps({"type": "flush"}))
        first, audio_1 = until_done(ws)
        ws.send_text(json.dumps({"type": "text", "text": "Four. "}))
        ws.send_text(json.dumps({"type": "close"}))
        second, audio_2 = until_done(ws)
    kinds = [(e["type"], e.get("index")) for e in first]
    assert kinds == [("sentence.start", 0), ("sentence.end", 0), ("sentence.start", 1), ("sentence.end", 1),
                     ("sentence.start", 2), ("sentence.end", 2), ("done", None)]
    assert [e["text"] for e in first if e["type"] == "sentence.start"] == ["One. ", "Two. ", "Three"]
    assert audio_1.startswith(b"RIFF") and audio_2.startswith(b"RIFF")  # a new file after each flush
    assert audio_1.count(b"RIFF") == 1 and first[-1]["sentences"] == 3
    assert second[0] == {"type": "sentence.start", "index": 3, "text": "Four. ", "start": first[-1]["audio_seconds"]}


def test_a_bad_config_is_an_openai_error_naming_the_field(client: TestClient) -> None:
    with client.websocket_connect("/v1/audio/speech/ws") as ws:
        ws.send_text(json.dumps({**CONFIG, "temperature": -1}))
        error = json.loads(ws.receive()["text"])
        assert ws.receive()["type"] == "websocket.close"
    assert error["type"] == "error" and error["error"]["param"] == "temperature"


def test_text_waiting_too_long_for_a_sentence_end_ends_the_session(client: TestClient) -> None:
    limit = client.app.state.server.config.max_input_chars
    with client.websocket_connect("/v1/audio/speech/ws") as ws:
        ws.send_text(json.dumps(CONFIG))
        ws.send_text(json.dumps({"type": "text", "text": "x" * (limit + 1)}))
        error = json.loads(ws.receive()["text"])
    assert error["error"]["param"] == "text" and error["error"]["code"] == "input_too_long"


def test_an_idle_session_is_closed_and_a_speaking_one_is_not(tiny_assets) -> None:
    from chattts_velocity import Chat
    from chattts_velocity.serve import ServerConfig, create_app

    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True)
    config = ServerConfig(warmup_steps=0, max_new_token=400, ws_idle_timeout_s=0.3)
    with TestClient(create_app(chat, config)) as idle_client:
        with idle_client.websocket_connect("/v1/audio/speech/ws") as ws:
            ws.send_text(json.dumps({**CONFIG, "max_new_tokens": 400, "min_new_tokens": 400}))
            ws.send_text(json.dumps({"type": "text", "text": "A long one. Another long one. "}))
            ws.send_text(json.dumps({"type": "flush"}))
            events, _ = until_done(ws)  # silent client, but sentences to speak: not idle
            assert [e["type"] for e in events].count("sentence.end") == 2 and events[-1]["type"] == "done"
            error = json.loads(ws.receive()["text"])  # then nothing to speak and nothing sent: closed
            assert error["error"]["code"] == "idle_timeout" and ws.receive()["code"] == 1000
