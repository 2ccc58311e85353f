"""Fairness and bounds against the real server process (`run_server`, tiny random weights, loopback only): a client
that floods the queue, or the text work, does not delay another client's request by more than 2 s (clients are
told apart by address: each test client sends from a loopback address of its own), a client over its queue cap gets
429 with Retry-After, and bodies past the global budget get 503 at once (a stalled reader:
tests/serve/test_edge_limits.py)."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
QUEUE_CAP = 20  # pieces are queued one a step and live about 24 steps: a 100-piece request passes it
BUDGET = 2 << 20
SERVE = """
import sys
from chattts_velocity import Chat
from chattts_velocity.serve import ServerConfig, run_server
def load():
    chat = Chat()
    chat.load(source="custom", custom_path=sys.argv[1], verify=False, use_vllm=True)
    return chat
run_server(load, ServerConfig(cache_mb=0, voices_dir=sys.argv[3], warmup_steps=4, max_new_token=24,
                              max_queued_per_client={cap}, body_budget_bytes={budget}),
           port=int(sys.argv[2]), log_level="warning")
"""
SENTENCES = " ".join(f"Sentence number {k} is here." for k in range(100))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_assets, tmp_path_factory) -> Iterator[tuple[str, int]]:
    port, tmp = _free_port(), tmp_path_factory.mktemp("fair")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    log = open(tmp / "server.log", "w")
    code = SERVE.format(cap=QUEUE_CAP, budget=BUDGET)
    proc = subprocess.Popen([sys.executable, "-c", code, str(tiny_assets), str(port), str(tmp / "voices")],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, (tmp / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        yield url, port
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def gauge(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return float(re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M).group(1))


def wait_idle(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while gauge(url, "chattts_kv_cache_blocks_used") or gauge(url, "chattts_requests_running"):
        assert time.monotonic() < deadline, "the engine kept requests or KV blocks"
        time.sleep(0.2)


def speak(url: str, text: str, peer: str = "127.0.0.1", stream: bool = False) -> httpx.Response:
    """A request from `peer`, a loopback address of its own: a keyless server tells clients apart by address."""
    with httpx.Client(transport=httpx.HTTPTransport(local_address=peer), timeout=120) as client:
        return client.post(url + "/v1/audio/speech", json={"model": "chattts", "input": text, "voice": "alloy",
                                                           "response_format": "pcm", "stream": stream})


def test_a_flooding_client_delays_another_by_at_most_2_s(server) -> None:
    url, _ = server
    speak(url, "Warm up.")
    start = time.perf_counter()
    assert speak(url, "Hello there.").status_code == 200
    alone = time.perf_counter() - start
    floods = [threading.Thread(target=speak, args=(url, SENTENCES, "127.0.0.2")) for _ in range(4)]  # capped at 20
    for thread in floods:
        thread.start()
    time.sleep(1.0)
    start = time.perf_counter()
    assert speak(url, "Hello there.").status_code == 200
    beside = time.perf_counter() - start
    for thread in floods:
        thread.join()
    assert beside < alone + 2.0, (alone, beside)
    wait_idle(url)


def test_a_client_over_its_queue_cap_gets_429_with_retry_after(server) -> None:
    url, _ = server
    refused = speak(url, SENTENCES, "127.0.0.3")
    other = speak(url, "Another client.", "127.0.0.4")
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded" and other.status_code == 200
    wait_idle(url)


def test_bodies_past_the_budget_get_503_at_once(server) -> None:
    url, port = server
    with socket.create_connection(("127.0.0.1", port)) as slow:
        slow.sendall(b"POST /v1/audio/voices HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                     b"X-Requested-With: tests\r\n"
                     b"Content-Length: %d\r\n\r\n" % (BUDGET - 1000) + b"x" * 1000)
        time.sleep(0.5)
        start = time.perf_counter()
        refused = httpx.post(url + "/v1/audio/speech", content=b"{" + b" " * 4000 + b"}", timeout=10,
                             headers={"Content-Type": "application/json"})
        assert refused.status_code == 503 and time.perf_counter() - start < 1.0
        assert refused.json()["error"]["code"] == "server_busy" and refused.headers["retry-after"] == "1"
    time.sleep(0.5)
    assert speak(url, "After the upload.").status_code == 200


def test_a_client_flooding_text_work_delays_another_by_at_most_2_s(server) -> None:
    """80 inputs of 511 characters (normalising each costs tens of ms of CPU) from one client: another client's
    one sentence waits at most for the text jobs already running, not the flood's queue, and never fails."""
    url, _ = server
    start = time.perf_counter()
    assert speak(url, "Hello there.").status_code == 200
    alone = time.perf_counter() - start
    text = ("On 3/5/2024 we paid $3.50 for 12 apples, 7 pears and 1,234 grapes. " * 8)[:511]
    floods = [threading.Thread(target=speak, args=(url, text, "127.0.0.5")) for _ in range(80)]
    for thread in floods:
        thread.start()
    time.sleep(1.0)
    start = time.perf_counter()
    answer = speak(url, "Hello there.")
    beside = time.perf_counter() - start
    for thread in floods:
        thread.join()
    print(f"one sentence alone {alone:.2f} s, beside 80 texts of 511 characters {beside:.2f} s")
    assert answer.status_code == 200, answer.text[:300]
    assert beside < alone + 2.0, (alone, beside)
    wait_idle(url)
