"""Clients that leave stop costing, and identity a client cannot choose, against the real server process
(`run_server`, tiny random weights, loopback only).

- Clients that open refine requests (`refine beams 8` on several sentences) and vanish: the engine is idle
  (nothing running or waiting) in well under the time one such request takes alone, and a new request is served.
- Streams whose clients read nothing: their connections are closed at the send timeout (the server holds no socket
  for them), and SIGTERM with such a stream open exits within the grace period.
- A keyless server tells clients apart by their address, not by the bearer token they send.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from health_wait import wait_healthy
from timing import Slowness

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
SEND_TIMEOUT_S = 2.0
GRACE_S = 3.0
QUEUE_CAP = 8
SERVE = """
import sys
from chattts_velocity import Chat
from chattts_velocity.serve import ServerConfig, run_server
def load():
    chat = Chat()
    chat.load(source="custom", custom_path=sys.argv[1], verify=False, use_vllm=True)
    return chat
run_server(load, ServerConfig(cache_mb=0, voices_dir=sys.argv[3], warmup_steps=4, max_new_token={steps},
                              send_timeout_s={send}, shutdown_grace_s={grace}, max_queued_per_client={cap},
                              stream_window_pieces=2, text_processes=0),
           port=int(sys.argv[2]), log_level="warning")
"""
REFINE_TEXT = " ".join(f"Sentence number {k} is here." for k in range(QUEUE_CAP))
# more audio than the kernel's socket buffers and the transport hold (64 pieces of 200 steps, about 200 KB of pcm
# each): a client that reads none of it leaves bytes queued in the server
PIECE_STEPS = 200
UNREAD = {"input": " ".join(f"Sentence {k} here." for k in range(64)), "voice": "alloy", "response_format": "pcm",
          "stream": True, "min_new_tokens": PIECE_STEPS}


class Server(NamedTuple):
    url: str
    port: int
    proc: subprocess.Popen


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tiny_assets: Path, tmp: Path) -> Server:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    log = open(tmp / "server.log", "w")
    code = SERVE.format(send=SEND_TIMEOUT_S, grace=GRACE_S, cap=QUEUE_CAP, steps=PIECE_STEPS)
    proc = subprocess.Popen([sys.executable, "-c", code, str(tiny_assets), str(port), str(tmp / "voices")],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, tmp / "server.log")
    return Server(url, port, proc)


def _stop(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(30)
    except subprocess.TimeoutExpired:
        server.proc.kill()


@pytest.fixture(scope="module")
def server(tiny_assets, tmp_path_factory) -> Iterator[Server]:
    started = _start(tiny_assets, tmp_path_factory.mktemp("departed"))
    try:
        yield started
    finally:
        _stop(started)


def gauge(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return float(re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M).group(1))


def busy(url: str) -> bool:
    return bool(gauge(url, "chattts_requests_running") or gauge(url, "chattts_requests_waiting"))


def raw_request(port: int, body: dict, headers: str = "") -> socket.socket:
    """A POST /v1/audio/speech sent on a socket that will read nothing (a small receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    data = json.dumps(body).encode()
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + headers.encode()
                 + b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return sock


def server_sockets(server: Server) -> int:
    fds = Path(f"/proc/{server.proc.pid}/fd")
    count = 0
    for fd in fds.iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except OSError:
            pass
    return count


REFINE = {"input": REFINE_TEXT, "voice": "alloy", "response_format": "pcm", "instructions": "refine beams 8"}


def test_clients_that_leave_during_their_refine_pass_free_the_engine(server: Server) -> None:
    start = time.perf_counter()
    assert httpx.post(server.url + "/v1/audio/speech", json=REFINE, timeout=600).status_code == 200
    alone = time.perf_counter() - start  # one refine request's own time, on this host, now
    sockets = [raw_request(server.port, REFINE) for _ in range(3)]
    deadline = time.monotonic() + 10 * alone + 60
    while not busy(server.url):  # their refine passes are in the engine
        assert time.monotonic() < deadline, "the refine requests never reached the engine"
        time.sleep(0.05)
    for sock in sockets:
        sock.close()
    left = time.perf_counter()
    while busy(server.url):
        assert time.monotonic() < deadline, "the engine kept the departed clients' requests"
        time.sleep(0.05)
    idle_after = time.perf_counter() - left
    print(f"one refine request alone {alone:.2f} s; idle {idle_after:.2f} s after its clients left")
    assert idle_after < alone / 2, (idle_after, alone)
    assert httpx.post(server.url + "/v1/audio/speech", json={**REFINE, "instructions": None, "input": "Hi."},
                      timeout=120).status_code == 200


def test_a_keyless_server_tells_clients_apart_by_address_not_token(server: Server) -> None:
    holder = raw_request(server.port, REFINE, "Authorization: Bearer A\r\n")  # QUEUE_CAP refine requests: the cap
    try:
        deadline = time.monotonic() + 120
        while gauge(server.url, "chattts_requests_running") + gauge(server.url, "chattts_requests_waiting") \
                < QUEUE_CAP:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        other_token = httpx.post(server.url + "/v1/audio/speech", timeout=60, headers={"Authorization": "Bearer B"},
                                 json={"input": "Hi.", "voice": "alloy", "response_format": "pcm"})
        assert other_token.status_code == 429, other_token.text[:300]  # the same peer: the same client
        assert other_token.json()["error"]["code"] == "rate_limit_exceeded"
    finally:
        holder.close()


def test_an_unread_stream_s_connection_is_closed_at_the_send_timeout(server: Server) -> None:
    before = server_sockets(server)
    sockets = [raw_request(server.port, UNREAD) for _ in range(3)]
    try:
        deadline = time.monotonic() + 120
        while server_sockets(server) < before + 3:
            assert time.monotonic() < deadline, "the server never accepted the connections"
            time.sleep(0.05)
        opened = time.monotonic()
        while server_sockets(server) > before:  # the server let go of every one of them
            assert time.monotonic() < deadline, "the server kept the unread connections open"
            time.sleep(0.1)
        assert time.monotonic() - opened >= SEND_TIMEOUT_S * 0.5  # closed for the timeout, not at once
        while busy(server.url):
            assert time.monotonic() < deadline, "the engine kept the unread streams' pieces"
            time.sleep(0.1)
    finally:
        for sock in sockets:
            sock.close()


def test_sigterm_with_an_unread_stream_open_exits_within_its_grace(tiny_assets, tmp_path) -> None:
    server = _start(tiny_assets, tmp_path)
    accepted = gauge(server.url, "chattts_engine_requests_total")
    sock = raw_request(server.port, UNREAD)
    try:
        deadline = time.monotonic() + 120
        while gauge(server.url, "chattts_engine_requests_total") == accepted:  # its pieces are in the engine
            assert time.monotonic() < deadline, "the stream never started"
            time.sleep(0.05)
        time.sleep(0.5)
        allowed = Slowness().scaled(GRACE_S * 20)  # its grace plus the teardown, on the reference host, scaled
        server.proc.send_signal(signal.SIGTERM)
        try:  # it exits within its grace (plus the model's teardown); a server that waits on the stream never does
            server.proc.wait(allowed)
        except subprocess.TimeoutExpired:
            pytest.fail("shutdown waited on the unread stream")
    finally:
        sock.close()
        if server.proc.poll() is None:
            server.proc.kill()
