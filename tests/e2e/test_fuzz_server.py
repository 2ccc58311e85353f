"""A hostile client against the real server on loopback: random and adversarial bodies and headers.

Invariants: every answer is 200 or a 4xx in OpenAI's error shape (never a 5xx, never a hang); afterwards a normal
request succeeds, /health is ok and no KV block is left in use. Bounded: a fixed example budget, derandomized.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")
from hypothesis import HealthCheck, given, settings  # noqa: E402 (after the importorskip above)
from hypothesis import strategies as st  # noqa: E402 (after the importorskip above)

from chattts_velocity import Chat  # noqa: E402 (after the importorskip above)
from chattts_velocity.serve import ServerConfig, create_app  # noqa: E402 (after the importorskip above)

pytestmark = pytest.mark.e2e
KEY = "fuzz-key"
FIELDS = ["model", "input", "voice", "response_format", "speed", "stream", "stream_format", "instructions", "seed",
          "temperature", "top_p", "top_k", "max_new_tokens", "min_new_tokens"]
HUGE = [2**63, 2**63 - 1, 2**64, 2**70, -(2**63), 10**400]
SPECIAL_FLOATS = ["NaN", "Infinity", "-Infinity", "1e-45", "1e308", "-0.0", "1e-320"]


def json_values(depth: int = 2) -> st.SearchStrategy:
    leaves = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**4), st.sampled_from(HUGE),
                       st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40),
                       st.sampled_from(["alloy", "wav", "pcm", "mp3", "sse", "tts-1", "", " ", "\x00", "默认"]))
    return leaves if depth == 0 else st.one_of(leaves, st.lists(json_values(depth - 1), max_size=3),
                                               st.dictionaries(st.text(max_size=5), json_values(depth - 1), max_size=3))


def bodies() -> st.SearchStrategy[bytes]:
    """Mostly near-valid bodies with hostile values; some raw text with special float tokens; some garbage."""
    near = st.fixed_dictionaries({"input": st.one_of(st.text(max_size=120), json_values(1))},
                                 optional={k: json_values(1) for k in FIELDS if k != "input"})
    as_json = near.map(lambda d: json.dumps(d, allow_nan=True).encode())
    special = st.tuples(st.sampled_from(["temperature", "top_p", "seed", "top_k", "speed", "max_new_tokens"]),
                        st.sampled_from(SPECIAL_FLOATS + [str(h) for h in HUGE])).map(
        lambda kv: f'{{"input": "Hello.", "voice": "alloy", "{kv[0]}": {kv[1]}}}'.encode())
    return st.one_of(as_json, as_json, special, st.binary(max_size=200), json_values(2).map(
        lambda v: json.dumps(v).encode()))


def headers() -> st.SearchStrategy[dict]:
    auth = st.sampled_from([f"Bearer {KEY}", f"Bearer {KEY}", "Bearer wrong", "Basic abc", "", f"bearer  {KEY}"])
    kind = st.sampled_from(["application/json", "application/json", "text/plain", "", "multipart/form-data"])
    return st.fixed_dictionaries({"Authorization": auth, "Content-Type": kind})


@pytest.fixture(scope="module")
def url(tiny_assets) -> Iterator[str]:
    def load() -> Chat:
        chat = Chat()
        chat.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True)
        return chat

    config = ServerConfig(api_key=KEY, max_new_token=6, max_input_chars=300, max_pieces=6, warmup_steps=0)
    app = create_app(load, config)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(60)


def assert_openai_answer(response: httpx.Response) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"] and error["type"]


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(body=bodies(), head=headers())
def test_hostile_bodies_get_200_or_an_openai_4xx(url: str, body: bytes, head: dict) -> None:
    with httpx.Client(timeout=60) as client:
        assert_openai_answer(client.post(url + "/v1/audio/speech", content=body, headers=head))


def test_the_server_is_whole_after_the_fuzzing(url: str) -> None:
    test_hostile_bodies_get_200_or_an_openai_4xx(url)  # runs the fuzz first when this test runs alone
    auth = {"Authorization": f"Bearer {KEY}"}
    ok = httpx.post(url + "/v1/audio/speech", headers=auth, timeout=60,
                    json={"input": "A normal request.", "voice": "alloy", "response_format": "wav"})
    assert ok.status_code == 200 and ok.content[:4] == b"RIFF"
    assert httpx.get(url + "/health", timeout=30).json() == {"status": "ok"}
    deadline = time.monotonic() + 120  # a deadline for a hung test only: the blocks must come back, at any speed
    while True:
        lines = httpx.get(url + "/metrics", timeout=30).text.splitlines()
        used = next(float(line.split()[-1]) for line in lines if line.startswith("chattts_kv_cache_blocks_used "))
        if used == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert used == 0
