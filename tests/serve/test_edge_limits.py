"""The edge's limits, on the ASGI interface and on a real loopback socket: ambiguous framing and oversized headers
(400, connection closed), +json bodies checked like JSON, the global body budget (503 at once, given back), uploads
spooled and handed on whole, and errors that name the clause or file without Python reprs."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
from timing import Slowness

from chattts_velocity.engine.async_engine import ClientBusy
from chattts_velocity.serve.edge import MAX_HEADER_BYTES, REPLAY_CHUNK, Edge
from chattts_velocity.serve.instructions import parse_instructions
from chattts_velocity.serve.request import bad_request


class Recorder:
    """An ASGI app that reads the whole body and answers 200 with its length."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.messages = 0

    async def __call__(self, scope, receive, send) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
            self.messages += 1
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(len(body)).encode()})


def scope(headers: dict[str, str], path: str = "/v1/audio/speech") -> dict:
    return {"type": "http", "method": "POST", "path": path,
            "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}


async def call(edge: Edge, headers: dict[str, str], chunks: list[bytes], hold: asyncio.Event | None = None,
               path: str = "/v1/audio/speech") -> tuple[int, dict, bytes]:
    """`chunks` as the body's messages; with `hold`, the last one is sent only once `hold` is set."""
    sent: list[dict] = []
    pending = list(chunks)

    async def receive() -> dict:
        if not pending:
            await asyncio.sleep(3600)
        if hold is not None and len(pending) == 1:
            await hold.wait()
        return {"type": "http.request", "body": pending.pop(0), "more_body": bool(pending)}

    async def send(message: dict) -> None:
        sent.append(message)

    await edge(scope(headers, path), receive, send)
    head = {k.decode(): v.decode() for k, v in sent[0].get("headers", [])}
    return sent[0]["status"], head, b"".join(m.get("body", b"") for m in sent[1:])


def run(coro):
    return asyncio.run(coro)


def test_transfer_encoding_with_content_length_is_a_400_that_closes_the_connection() -> None:
    app = Recorder()
    status, head, body = run(call(Edge(app, None, 1 << 20), {"content-length": "2", "transfer-encoding": "chunked"},
                                  [b"{}"]))
    assert (status, head["connection"]) == (400, "close") and not app.bodies
    assert json.loads(body)["error"]["code"] == "invalid_request"


def test_a_header_section_over_the_stated_limit_is_a_400() -> None:
    app = Recorder()
    edge = Edge(app, None, 1 << 20)
    status, _, body = run(call(edge, {"x-big": "a" * MAX_HEADER_BYTES}, [b"{}"]))
    assert status == 400 and json.loads(body)["error"]["code"] == "headers_too_large" and not app.bodies
    assert run(call(edge, {"x-big": "a" * (MAX_HEADER_BYTES // 2)}, [b"{}"]))[0] == 200


@pytest.mark.parametrize("kind", ["application/json", "application/vnd.api+json", "Application/Problem+JSON; a=b"])
def test_plus_json_bodies_get_the_same_json_checks(kind: str) -> None:
    status, _, body = run(call(Edge(Recorder(), None, 1 << 20), {"content-type": kind},
                               [b'{"seed": ' + b"9" * 5001 + b"}"]))
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_json"


def test_the_body_budget_refuses_new_bodies_at_once_and_is_given_back() -> None:
    """"At once" as causality: the refusals come while the upload holding the budget is still waiting for its last
    chunk (held until they are answered), so an edge that waited for the budget to come back would never answer
    them (60 s, only so that such an edge fails instead of hanging)."""
    app = Recorder()
    edge = Edge(app, None, 1 << 20, body_budget=100)
    raw = {"content-type": "application/octet-stream"}

    async def claimed() -> None:
        while not edge.budget.used:
            await asyncio.sleep(0.01)

    async def scenario():
        hold = asyncio.Event()
        slow = asyncio.create_task(call(edge, {**raw, "content-length": "80"}, [b"a" * 40, b"a" * 40], hold))
        await asyncio.wait_for(claimed(), 60)
        refused = await asyncio.wait_for(call(edge, {**raw, "content-length": "40"}, [b"b" * 40]), 60)
        chunked = await asyncio.wait_for(call(edge, raw, [b"c" * 15, b"c" * 15]), 60)  # counted as they come
        still_uploading = not slow.done()
        hold.set()
        return await slow, refused, still_uploading, chunked

    slow, refused, still_uploading, chunked = run(scenario())
    assert slow[0] == 200 and refused[0] == 503 and still_uploading and refused[1]["retry-after"] == "1"
    assert json.loads(refused[2])["error"] | {"message": ""} == {"message": "", "type": "server_error",
                                                                 "param": None, "code": "server_busy"}
    assert chunked[0] == 503 and edge.budget.used == 0
    assert run(call(edge, {**raw, "content-length": "90"}, [b"d" * 90]))[0] == 200 and edge.budget.used == 0


def test_an_upload_is_spooled_and_handed_on_whole_in_chunks() -> None:
    app = Recorder()
    data = bytes(range(256)) * (3 << 12)  # 3 MiB
    status, _, _ = run(call(Edge(app, None, 1 << 20, path_limits={"/v1/audio/voices": 16 << 20}),
                            {"content-type": "multipart/form-data; boundary=x"}, [data[: 1 << 20], data[1 << 20:]],
                            path="/v1/audio/voices"))
    assert status == 200 and app.bodies == [data] and app.messages >= len(data) // REPLAY_CHUNK


def test_refine_beams_with_a_fraction_names_the_whole_clause() -> None:
    with pytest.raises(ValueError, match="cannot honour 'refine beams 1.5'"):
        parse_instructions("refine beams 1.5")
    assert parse_instructions("speed 5. refine beams 2").beams == 2


def test_an_unreadable_upload_is_named_without_a_python_repr(client) -> None:
    response = client.post("/v1/audio/voices", data={"name": "garbage", "transcript": "hi"},
                           files={"file": ("clip.wav", b"RIFF not really audio" * 50, "audio/wav")},
                           headers={"X-Requested-With": "tests"})
    message = response.json()["error"]["message"]
    assert response.status_code == 400 and message.startswith("file: is not audio this server can read (")
    assert " at 0x" not in message and "<" not in message


def test_on_a_socket_ambiguous_framing_closes_the_connection_and_a_pipelined_request_is_not_served() -> None:
    import uvicorn

    from chattts_velocity.serve.timeouts import header_timeout_protocol

    app = Recorder()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(Edge(app, None, 1 << 20), host="127.0.0.1", port=port, log_level="error",
                                           http=header_timeout_protocol(5.0), lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        smuggled = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked"
                    b"\r\n\r\n0\r\n\r\nPOST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:  # a hang deadline only
            conn.sendall(smuggled)
            received = b""
            while chunk := conn.recv(65536):
                received += chunk
        assert received.startswith(b"HTTP/1.1 400") and received.count(b"HTTP/1.1") == 1 and not app.bodies
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_busy_client_gets_429_with_retry_after_in_openai_s_shape() -> None:
    error = bad_request(ClientBusy("input: this client has 512 pieces unfinished"))
    assert error.status_code == 429 and error.headers == {"Retry-After": "1"}
    assert error.detail == {"message": "input: this client has 512 pieces unfinished", "type": "invalid_request_error",
                            "param": "input", "code": "rate_limit_exceeded"}


def test_a_response_whose_client_stops_reading_is_abandoned_after_send_timeout() -> None:
    closed = asyncio.Event()

    async def endless(scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        try:
            while True:
                await send({"type": "http.response.body", "body": b"x" * 4096, "more_body": True})
        finally:
            closed.set()

    async def stalled_client(message: dict) -> None:
        if message["type"] == "http.response.body":
            await asyncio.sleep(3600)  # the transport's buffer is full: its drain never comes

    async def scenario() -> float:
        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        start = time.perf_counter()
        await Edge(endless, None, 1 << 20, send_timeout=0.3)(scope({}), receive, stalled_client)
        assert closed.is_set()
        return time.perf_counter() - start

    slowness = Slowness()
    took = run(scenario())
    # not before its 0.3 s timeout, and within 1.7 s past it on the reference host (scaled by this host's slowness
    # before and after): an edge that never gives up waits out the client's hour
    assert 0.3 <= took < 0.3 + slowness.sample().scaled(1.7), (took, slowness)
