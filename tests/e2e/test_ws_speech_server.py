"""The speech WebSocket through the real server (uvicorn on loopback, tiny random weights, a `websockets` client):
words split across frames, sentences completed late, each sentence's audio equal to the HTTP route's, a client
that stops reading, a disconnect mid-sentence freeing its seat, the per-client limit, auth and config errors."""
from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
websockets = pytest.importorskip("websockets")
pytest.importorskip("fastapi")

from websockets.asyncio.client import connect  # noqa: E402 (after the importorskip above)

from chattts_velocity import Chat  # noqa: E402 (after the importorskip above)
from chattts_velocity.serve import ServerConfig, create_app  # noqa: E402 (after the importorskip above)

pytestmark = pytest.mark.e2e
KEY = "ws-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
STEPS = 16
CONFIG = {"type": "config", "voice": "alloy(2)+echo", "response_format": "pcm", "seed": 4,
          "max_new_tokens": STEPS, "min_new_tokens": STEPS}


class Server(NamedTuple):
    url: str
    ws: str
    app: Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_assets, tmp_path_factory) -> Iterator[Server]:
    def load() -> Chat:
        chat = Chat()
        chat.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True)
        return chat

    config = ServerConfig(api_key=KEY, warmup_steps=0, max_new_token=400, cache_mb=0, send_timeout_s=2.0,
                          ws_sessions_per_client=2, stream_window_pieces=2,
                          voices_dir=str(tmp_path_factory.mktemp("voices")))
    app = create_app(load, config)
    port = _free_port()
    uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield Server(f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}/v1/audio/speech/ws", app)
    finally:
        uv.should_exit = True
        thread.join(60)


def wait_until(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached")
        time.sleep(0.05)


def idle(server: Server) -> bool:
    """No session open and nothing held in the engine."""
    engine = server.app.state.server.engine.metrics()
    return not +server.app.state.ws_sessions and engine["kv_blocks_used"] == 0 and engine["num_running"] == 0


async def events_until_done(ws, first: dict | None = None) -> tuple[list[dict], dict[int, bytes]]:
    """JSON events up to the first done (after `first`, already read), and each sentence's audio bytes (binary
    frames between its start and end)."""
    events: list[dict] = [] if first is None else [first]
    current = None if first is None else first["index"]
    audio: dict[int, bytes] = {} if first is None else {current: b""}
    while True:
        message = await ws.recv()
        if isinstance(message, bytes):
            assert current is not None, "audio outside a sentence"
            audio[current] += message
            continue
        event = json.loads(message)
        events.append(event)
        if event["type"] == "sentence.start":
            current = event["index"]
            audio[current] = b""
        elif event["type"] == "done":
            return events, audio


def http_pcm(server: Server, text: str) -> bytes:
    body = {**{k: v for k, v in CONFIG.items() if k != "type"}, "input": text, "stream": True}
    response = httpx.post(server.url + "/v1/audio/speech", json=body, headers=AUTH, timeout=300)
    assert response.status_code == 200, response.text
    return response.content


def test_words_split_across_frames_and_sentences_completed_late(server: Server) -> None:
    async def session() -> tuple[list[dict], dict[int, bytes], list[dict]]:
        async with connect(server.ws, additional_headers=AUTH) as ws:
            await ws.send(json.dumps(CONFIG))
            for delta in ("Hel", "lo th", "ere.", " Gen", "eral Ke"):
                await ws.send(json.dumps({"type": "text", "text": delta}))
            first = json.loads(await ws.recv())  # "Hello there. " completed by " Gen": spoken before the rest
            await ws.send(json.dumps({"type": "text", "text": "nobi. And the la"}))
            await ws.send(json.dumps({"type": "text", "text": "st one"}))
            await ws.send(json.dumps({"type": "flush"}))
            events, audio = await events_until_done(ws, first)
            await ws.send(json.dumps({"type": "close"}))
            closing = [json.loads(m) async for m in ws if isinstance(m, str)]
            return events, audio, closing

    events, audio, closing = asyncio.run(session())
    assert events[0] == {"type": "sentence.start", "index": 0, "text": "Hello there. ", "start": 0.0}
    starts = [e for e in events if e["type"] == "sentence.start"]
    assert [e["text"] for e in starts] == ["Hello there. ", "General Kenobi. ", "And the last one"]
    ends = [e for e in events if e["type"] == "sentence.end"]
    assert [e["end"] for e in ends[:-1]] == [e["start"] for e in starts[1:]]  # back to back, in order
    assert events[-1]["type"] == "done" and events[-1]["audio_seconds"] == ends[-1]["end"]
    for k, text in enumerate(["Hello there. ", "General Kenobi. ", "And the last one"]):
        assert audio[k] == http_pcm(server, text)  # each sentence is what the HTTP route says for it
    assert [e["type"] for e in closing] == ["done"]  # close: what was left is flushed, then the socket closes
    wait_until(lambda: idle(server))


def test_a_client_that_stops_reading_loses_its_session_not_the_server(server: Server) -> None:
    before = server.app.state.server.engine.metrics()["num_requests"]

    async def stalled() -> None:
        async with connect(server.ws, additional_headers=AUTH, max_queue=1) as ws:
            await ws.send(json.dumps({**CONFIG, "max_new_tokens": 400, "min_new_tokens": 400}))
            await ws.send(json.dumps({"type": "text", "text": "Talk a lot. " * 40}))
            await ws.send(json.dumps({"type": "flush"}))
            # read nothing: the server's sends block on the socket, then its send timeout ends the session
            await asyncio.get_running_loop().run_in_executor(None, wait_until, lambda: idle(server))

    asyncio.run(stalled())
    opened = server.app.state.server.engine.metrics()["num_requests"] - before
    assert 1 <= opened < 40  # backpressure: sentences past the window were never started for a reader that stalled
    test_words_split_across_frames_and_sentences_completed_late(server)  # the next client is served as before


def test_a_disconnect_mid_sentence_frees_its_seat(server: Server) -> None:
    async def run() -> tuple[dict, int]:
        async with connect(server.ws, additional_headers=AUTH) as keep:
            await keep.send(json.dumps(CONFIG))
            ws = await connect(server.ws, additional_headers=AUTH)
            await ws.send(json.dumps({**CONFIG, "max_new_tokens": 400, "min_new_tokens": 400}))
            await ws.send(json.dumps({"type": "text", "text": "A long sentence. Another. "}))
            assert json.loads(await ws.recv())["type"] == "sentence.start"
            async with connect(server.ws, additional_headers=AUTH) as third:  # two seats per client, both taken
                refused = json.loads(await third.recv())
                await third.wait_closed()
                code = third.close_code
            ws.transport.abort()  # gone mid-sentence, no close frame
            await asyncio.get_running_loop().run_in_executor(
                None, wait_until, lambda: server.app.state.ws_sessions.total() == 1)
            async with connect(server.ws, additional_headers=AUTH) as again:  # the seat is free again
                await again.send(json.dumps(CONFIG))
                await again.send(json.dumps({"type": "close"}))
                assert [json.loads(m)["type"] async for m in again] == ["done"]
        return refused, code

    refused, code = asyncio.run(run())
    assert refused["error"]["code"] == "too_many_sessions" and code == 1013
    wait_until(lambda: idle(server))


@pytest.mark.parametrize("headers, frames, param, code", [
    ({}, [CONFIG], None, "invalid_api_key"),
    (AUTH, [{**CONFIG, "voice": "alloy(0)+echo"}], "voice", None),
    (AUTH, [{**CONFIG, "input": "Hi."}], "input", None),
    (AUTH, [{"type": "text", "text": "Hi."}], "type", None),
    (AUTH, [CONFIG, {"type": "shout"}], "type", None),
    (AUTH, [{**CONFIG, "response_format": "wmv"}], "response_format", "unsupported_response_format"),
])
def test_refusals_are_openai_errors_then_a_policy_close(server: Server, headers, frames, param, code) -> None:
    async def run() -> tuple[dict, int | None]:
        async with connect(server.ws, additional_headers=headers) as ws:
            for frame in frames:
                with contextlib.suppress(websockets.ConnectionClosed):  # a refusal may close before we send
                    await ws.send(json.dumps(frame))
            error = json.loads(await ws.recv())
            await ws.wait_closed()
            return error, ws.close_code

    error, close_code = asyncio.run(run())
    assert error["type"] == "error" and set(error["error"]) == {"message", "type", "param", "code"}
    assert error["error"]["param"] == param and error["error"]["code"] == code and close_code == 1008
    wait_until(lambda: idle(server))
