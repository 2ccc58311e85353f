"""Hostile clients against the real server process (`run_server`, tiny random weights, loopback).

Every case gets its answer quickly, /health keeps answering throughout (the longest gap between its answers is
asserted under HEALTH_GAP_S), the server's memory does not grow past MEMORY_GROWTH_BYTES, and a normal request
still works afterwards. Time bounds are written for a quiet reference host and scaled by this host's slowness,
measured in the same test before and after the hostile work (tests/timing.py): a loaded host passes, and a stall
of seconds, which stretches by the same factor, still fails.
"""
from __future__ import annotations

import io
import json
import lzma
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from health_wait import wait_healthy
from timing import Slowness

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")
sf = pytest.importorskip("soundfile")
b14 = pytest.importorskip("pybase16384")

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
# bounds on the reference host (tests/timing.py), each scaled by the slowness measured in its test:
HEALTH_GAP_S = 0.5  # the longest time /health may go unanswered while hostile requests are handled
STALL_S = 0.5  # how much longer another client's live stream may wait for a chunk than it does alone
ANSWER_S = 15.0  # the longest any hostile request may take to be answered (its text budget: 10 s of CPU)
REFUSAL_S = 1.0  # how much longer a bomb's refusal may take than an ordinary bad voice's (decoding it took seconds)
HANG_S = 300.0  # an HTTP client's timeout: only stops a hung test
MEMORY_GROWTH_BYTES = 300 << 20  # resident memory after every hostile case vs after the first normal request
TIMEOUT_S = 2.0  # the server's header and body timeouts in this test
UPLOAD_HEADERS = {"X-Requested-With": "tests"}  # a multipart upload needs a header no web form sends
LZMA2 = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]


class Server(NamedTuple):
    url: str
    port: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVE = """
import sys
from chattts_velocity import Chat
from chattts_velocity.serve import ServerConfig, run_server
def load():
    chat = Chat()
    chat.load(source="custom", custom_path=sys.argv[1], verify=False, use_vllm=True)
    return chat
run_server(load, ServerConfig(cache_mb=0, voices_dir=sys.argv[3], header_timeout_s={t}, body_timeout_s={t},
                              warmup_steps=4), port=int(sys.argv[2]), log_level="warning")
"""


@pytest.fixture(scope="module")
def server(tiny_assets, tmp_path_factory) -> Iterator[Server]:
    port, tmp = _free_port(), tmp_path_factory.mktemp("hostile")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", SERVE.format(t=TIMEOUT_S), str(tiny_assets), str(port),
                             str(tmp / "voices")], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, tmp / "server.log")
        yield Server(url, port)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


class HealthWatch:
    """Polls /health from a thread; `gap` is the longest time between two answers (or since the last one)."""

    def __init__(self, url: str) -> None:
        self.url, self.gap, self.failures = url, 0.0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)

    def _poll(self) -> None:
        with httpx.Client(timeout=30) as client:
            last = time.monotonic()
            while not self._stop.is_set():
                answer = client.get(self.url + "/health")
                now = time.monotonic()
                if answer.status_code != 200:
                    self.failures.append(answer.status_code)
                self.gap, last = max(self.gap, now - last), now
                time.sleep(0.02)


def resident_bytes(server: Server) -> float:
    text = httpx.get(server.url + "/metrics").text
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("process_resident_memory_bytes")))


def speak(server: Server, timeout: float = HANG_S, **body) -> httpx.Response:
    body = {"input": "Hello there.", "voice": "alloy", "response_format": "wav", "max_new_tokens": 4, **body}
    return httpx.post(server.url + "/v1/audio/speech", json=body, timeout=timeout)


def error(response: httpx.Response) -> dict:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    return response.json()["error"]


def speaker_bomb() -> str:
    """32 MiB of zeros as a speaker string (about 3,000 characters: under the length limit, so the decoder's output
    bound is what refuses it)."""
    return b14.encode_to_string(lzma.compress(bytes(32 << 20), format=lzma.FORMAT_RAW, filters=LZMA2))


def clip_code(rows: int, cols: int) -> str:
    """A clip code whose header says [rows, cols] (zeros; compresses to almost nothing)."""
    payload = lzma.compress(bytes(2 * rows * cols), format=lzma.FORMAT_RAW, filters=LZMA2)
    return b14.encode_to_string(struct.pack("<HH", rows, cols) + payload)


def flac_claiming(seconds: int, channels: int = 8, rate: int = 48000) -> bytes:
    """A one-second FLAC whose STREAMINFO says `seconds` long (a header a bomb would carry)."""
    buffer = io.BytesIO()
    sf.write(buffer, np.zeros((rate, channels), np.float32), rate, format="FLAC")
    data = bytearray(buffer.getvalue())
    info = 8  # "fLaC", then the STREAMINFO block header; total samples are the low 36 bits of bytes 13..17
    field = int.from_bytes(data[info + 10: info + 18], "big")
    field = (field & ~((1 << 36) - 1)) | (seconds * rate)
    data[info + 10: info + 18] = field.to_bytes(8, "big")
    return bytes(data)


def float_wav(samples: np.ndarray, rate: int = 24000) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples.astype(np.float32), rate, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


TEXT_CASES = {  # the server's maximum input (4096 characters) of what used to take seconds each on the loop
    "nines": "9 " * 2048,
    "dashes": "-" * 4096,
    "phones": "+1-555-555-5555 " * 256,
    "cardinal": '<speak><say-as interpret-as="cardinal">' + "7" * 4000 + "</say-as></speak>",
}


def test_text_work_never_stalls_health(server: Server) -> None:
    """Each hostile text is answered within ANSWER_S, and the longest /health gap meanwhile is under HEALTH_GAP_S,
    both scaled by this host's slowness (a text normalised on the event loop stalled /health for seconds)."""
    assert speak(server).status_code == 200
    slowness, took = Slowness(), {}
    with HealthWatch(server.url) as watch, ThreadPoolExecutor(4) as pool:
        for name, text in TEXT_CASES.items():  # one at a time, then four at once
            started = time.monotonic()
            answer = speak(server, input=text)
            assert answer.status_code in (200, 400), (name, answer.text[:300])
            took[name] = time.monotonic() - started
        answers = list(pool.map(lambda text: speak(server, input=text), TEXT_CASES.values()))
        assert all(a.status_code in (200, 400) for a in answers)
    slowness.sample()
    print(f"longest /health gap {watch.gap:.3f} s, answers {took}, {slowness}")
    assert max(took.values()) < slowness.scaled(ANSWER_S), (took, slowness)
    assert not watch.failures and watch.gap < slowness.scaled(HEALTH_GAP_S), (watch.gap, slowness)


def longest_chunk_gap(server: Server) -> float:
    """A live stream of 300 steps: the longest wait between two of its chunks."""
    body = {"input": "A live stream keeps going.", "voice": "alloy", "response_format": "pcm", "stream": True,
            "seed": 1, "max_new_tokens": 300, "min_new_tokens": 300}
    gaps, last = [0.0], None
    with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, timeout=120) as response:
        for _ in response.iter_bytes():
            now = time.monotonic()
            gaps.append(now - last if last is not None else 0.0)
            last = now
    return max(gaps)


def test_text_work_never_stalls_another_clients_stream(server: Server) -> None:
    """The stream's longest chunk gap beside three long texts vs the same stream's alone, measured before and after
    (the larger: the host's load may change meanwhile): at most STALL_S longer, scaled by this host's slowness."""
    slowness = Slowness()
    alone = longest_chunk_gap(server)
    with ThreadPoolExecutor(4) as pool:
        stream = pool.submit(longest_chunk_gap, server)
        time.sleep(0.3)
        texts = [pool.submit(speak, server, input=TEXT_CASES[name]) for name in ("nines", "dashes", "cardinal")]
        beside = stream.result()
        assert all(t.result().status_code == 400 for t in texts)
    alone = max(alone, longest_chunk_gap(server))
    slowness.sample()
    print(f"longest chunk gap alone {alone:.3f} s, beside three long texts {beside:.3f} s, {slowness}")
    assert beside < alone + slowness.scaled(STALL_S), (alone, beside, slowness)


def refusal_time(server: Server, voice: str) -> float:
    started = time.monotonic()
    assert error(speak(server, voice=voice))["param"] == "voice"
    return time.monotonic() - started


def test_decoder_bombs_are_refused_at_once(server: Server) -> None:
    """Each bomb is refused at most REFUSAL_S later than an ordinary bad voice (a short string that is not a speaker,
    timed before and after, the larger), and /health's longest gap stays under HEALTH_GAP_S: both scaled by this
    host's slowness."""
    assert speak(server).status_code == 200
    before = resident_bytes(server)
    bomb = speaker_bomb()
    slowness, ordinary = Slowness(), refusal_time(server, "蘁淰" * 8)
    with HealthWatch(server.url) as watch:
        bombs = [refusal_time(server, voice) for voice in (bomb, bomb * 8)]  # the decoder's bound, the length check
        saved = httpx.post(server.url + "/v1/audio/voices", json={"name": "bomb", "speaker": bomb}, timeout=HANG_S)
        assert error(saved)["param"] == "speaker"
        upload = httpx.post(server.url + "/v1/audio/voices", data={"name": "clip", "transcript": "hi"},
                            files={"file": ("bomb.flac", flac_claiming(1000), "audio/flac")}, timeout=HANG_S,
                            headers=UPLOAD_HEADERS)
        assert upload.status_code == 413 and error(upload)["code"] == "clip_too_long"
    ordinary = max(ordinary, refusal_time(server, "蘁淰" * 8))
    slowness.sample()
    print(f"longest /health gap {watch.gap:.3f} s, bombs refused in {bombs} vs {ordinary:.3f} s, {slowness}")
    assert max(bombs) < ordinary + slowness.scaled(REFUSAL_S), (bombs, ordinary, slowness)
    assert not watch.failures and watch.gap < slowness.scaled(HEALTH_GAP_S), (watch.gap, slowness)
    assert resident_bytes(server) - before < MEMORY_GROWTH_BYTES


@pytest.mark.parametrize("fields, param", [
    ({"clip_code": clip_code(1000, 65535), "transcript": "hi"}, "clip_code"),
    ({"clip_code": clip_code(4, 65535), "transcript": "hi"}, "clip_code"),
    ({"clip_code": clip_code(4, 3000), "transcript": "hi"}, "clip_code"),  # over the engine's positions
])
def test_unusable_clip_codes_are_not_saved(server: Server, fields: dict, param: str) -> None:
    response = httpx.post(server.url + "/v1/audio/voices", json={"name": "unusable", **fields}, timeout=HANG_S)
    assert error(response)["param"] == param
    assert httpx.get(server.url + "/v1/audio/voices/unusable").status_code == 404


@pytest.mark.parametrize("samples", [np.full(24000, np.nan), np.full(24000, np.inf), np.full(24000, 1e30),
                                     np.zeros(24000)])
def test_unusable_recordings_are_not_saved(server: Server, samples: np.ndarray) -> None:
    response = httpx.post(server.url + "/v1/audio/voices", data={"name": "odd", "transcript": "hi"},
                          files={"file": ("odd.wav", float_wav(samples), "audio/wav")}, timeout=HANG_S,
                          headers=UPLOAD_HEADERS)
    assert response.status_code == 400 and error(response)["param"] == "file"


@pytest.mark.parametrize("text", ["\u200b\u200c", "\x00", "e\u0301"[1:] * 3, "\u00ad", "\u202e\u202c", "\ufe0f",
                                  '<speak><say-as interpret-as="characters">🙂</say-as></speak>'])
def test_text_with_nothing_to_say_is_empty_input(server: Server, text: str) -> None:
    found = error(speak(server, input=text))
    assert (found["code"], found["param"]) == ("empty_input", "input")


@pytest.mark.parametrize("raw, param", [
    (b"[" * 100_000 + b"]" * 100_000, None),
    (b'{"input": "hi", "seed": ' + b"9" * 5001 + b"}", None),
    (json.dumps({"input": "hi", "voice": "\u00b2"}).encode(), "voice"),
    (json.dumps({"input": "hi", "voice": "9" * 10_000}).encode(), "voice"),
    (json.dumps({"input": "hi", "speed": True}).encode(), "speed"),
    (json.dumps({"input": "中" * 2100, "max_new_tokens": 2048}).encode(), "input"),  # prompt + tokens > positions
])
def test_error_bodies_name_their_field(server: Server, raw: bytes, param: str | None) -> None:
    found = error(httpx.post(server.url + "/v1/audio/speech", content=raw, timeout=HANG_S,
                             headers={"Content-Type": "application/json"}))
    assert found["param"] == param, found
    if param is None:
        assert found["code"] == "invalid_json"
    assert "Traceback" not in found["message"] and "int()" not in found["message"]


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    sock.settimeout(seconds)
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
        return True, data
    except TimeoutError:
        return False, data


def test_slow_clients_are_timed_out(server: Server) -> None:
    """Closed by the server's TIMEOUT_S timeouts: within 5 s past them, scaled by this host's slowness."""
    window = TIMEOUT_S + Slowness().scaled(5.0)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n")  # the headers never end
        closed, _ = _closed_within(sock, window)
        assert closed
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"input\": ")  # 10 of 100 bytes
        closed, data = _closed_within(sock, window)
        assert data.startswith(b"HTTP/1.1 408") and b"request_timeout" in data
    assert speak(server).status_code == 200  # and everyone else is served
