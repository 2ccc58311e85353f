"""Fairness and bounds against the real server process (`run_server`, tiny random weights, loopback only): a client
that floods the queue, or the text work, does not delay another client's request by more than FAIR_DELAY_S beyond
its own time alone (clients are told apart by address: each test client sends from a loopback address of its own),
a client over its queue cap gets 429 with Retry-After, and bodies past the global budget get 503 at once (a stalled
reader: tests/serve/test_edge_limits.py). Time bounds are written for a quiet reference host and scaled by this
host's slowness, measured in the same test (tests/timing.py)."""
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
from health_wait import wait_healthy
from timing import Slowness

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
QUEUE_CAP = 20  # pieces are queued one a step and live about 24 steps: a 100-piece request passes it
BUDGET = 2 << 20
FAIR_DELAY_S = 2.0  # on the reference host: how much longer a bystander's request may take beside a flood than alone
REFUSAL_S = 1.0  # on the reference host: how much longer a 503 may take than the same body's answer when it fits
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
        wait_healthy(proc, url, tmp / "server.log")
        yield url, port
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def gauge(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=60).text
    return float(re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M).group(1))


def wait_idle(url: str, timeout: float = 240.0) -> None:  # a deadline for a hung test only
    deadline = time.monotonic() + timeout
    while gauge(url, "chattts_kv_cache_blocks_used") or gauge(url, "chattts_requests_running"):
        assert time.monotonic() < deadline, "the engine kept requests or KV blocks"
        time.sleep(0.2)


def speak(url: str, text: str, peer: str = "127.0.0.1", stream: bool = False) -> httpx.Response:
    """A request from `peer`, a loopback address of its own: a keyless server tells clients apart by address."""
    with httpx.Client(transport=httpx.HTTPTransport(local_address=peer), timeout=120) as client:
        return client.post(url + "/v1/audio/speech", json={"model": "chattts", "input": text, "voice": "alloy",
                                                           "response_format": "pcm", "stream": stream})


def timed_speak(url: str, text: str) -> tuple[httpx.Response, float]:
    start = time.perf_counter()
    answer = speak(url, text)
    return answer, time.perf_counter() - start


def alone_s(url: str) -> float:
    """One sentence's own time on this host now, with nothing else queued."""
    answer, took = timed_speak(url, "Hello there.")
    assert answer.status_code == 200, answer.text[:300]
    return took


def test_a_flooding_client_delays_another_by_at_most_2_s(server) -> None:
    """A bystander's sentence beside four 100-sentence floods vs the same sentence alone, timed before and after
    (the larger: the host's load may change meanwhile): at most FAIR_DELAY_S longer, scaled by this host's
    slowness. A server that runs the flood's queue first makes it wait for dozens of pieces."""
    url, _ = server
    speak(url, "Warm up.")
    slowness, alone = Slowness(), alone_s(url)
    floods = [threading.Thread(target=speak, args=(url, SENTENCES, "127.0.0.2")) for _ in range(4)]  # capped at 20
    for thread in floods:
        thread.start()
    time.sleep(1.0)
    answer, beside = timed_speak(url, "Hello there.")
    assert answer.status_code == 200, answer.text[:300]
    for thread in floods:
        thread.join()
    wait_idle(url)
    alone = max(alone, alone_s(url))
    slowness.sample()
    print(f"one sentence alone {alone:.2f} s, beside four floods {beside:.2f} s, {slowness}")
    assert beside < alone + slowness.scaled(FAIR_DELAY_S), (alone, beside, slowness)


def test_a_client_over_its_queue_cap_gets_429_with_retry_after(server) -> None:
    url, _ = server
    refused = speak(url, SENTENCES, "127.0.0.3")
    other = speak(url, "Another client.", "127.0.0.4")
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "rate_limit_exceeded" and other.status_code == 200
    wait_idle(url)


def post_body(url: str) -> tuple[httpx.Response, float]:
    """A 4 KB JSON body (an empty object: a 400 naming `input` when the budget has room for it) and its time."""
    start = time.perf_counter()
    answer = httpx.post(url + "/v1/audio/speech", content=b"{" + b" " * 4000 + b"}", timeout=300,
                        headers={"Content-Type": "application/json"})
    return answer, time.perf_counter() - start


def test_bodies_past_the_budget_get_503_at_once(server) -> None:
    """At once: while the budget's holder is still uploading, and at most REFUSAL_S (scaled by this host's slowness)
    later than the same body's answer when the budget has room, timed before and after (the larger)."""
    url, port = server
    slowness, (fits, alone) = Slowness(), post_body(url)
    assert fits.status_code == 400, fits.text[:300]
    with socket.create_connection(("127.0.0.1", port)) as slow:
        slow.sendall(b"POST /v1/audio/voices HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                     b"X-Requested-With: tests\r\n"
                     b"Content-Length: %d\r\n\r\n" % (BUDGET - 1000) + b"x" * 1000)
        time.sleep(0.5)
        refused, took = post_body(url)
        assert refused.status_code == 503, refused.text[:300]
        assert refused.json()["error"]["code"] == "server_busy" and refused.headers["retry-after"] == "1"
    time.sleep(0.5)
    assert speak(url, "After the upload.").status_code == 200
    alone = max(alone, post_body(url)[1])
    slowness.sample()
    print(f"503 in {took:.3f} s, the same body answered in {alone:.3f} s, {slowness}")
    assert took < alone + slowness.scaled(REFUSAL_S), (took, alone, slowness)


def test_a_client_flooding_text_work_delays_another_by_at_most_2_s(server) -> None:
    """80 inputs of 511 characters (normalising each costs tens of ms of CPU) from one client: another client's
    one sentence waits at most for the text jobs already running, not the flood's queue, and never fails: at most
    FAIR_DELAY_S longer than alone (timed before and after, the larger), scaled by this host's slowness."""
    url, _ = server
    slowness, alone = Slowness(), alone_s(url)
    text = ("On 3/5/2024 we paid $3.50 for 12 apples, 7 pears and 1,234 grapes. " * 8)[:511]
    floods = [threading.Thread(target=speak, args=(url, text, "127.0.0.5")) for _ in range(80)]
    for thread in floods:
        thread.start()
    time.sleep(1.0)
    answer, beside = timed_speak(url, "Hello there.")
    for thread in floods:
        thread.join()
    assert answer.status_code == 200, answer.text[:300]
    wait_idle(url)
    alone = max(alone, alone_s(url))
    slowness.sample()
    print(f"one sentence alone {alone:.2f} s, beside 80 texts of 511 characters {beside:.2f} s, {slowness}")
    assert beside < alone + slowness.scaled(FAIR_DELAY_S), (alone, beside, slowness)
