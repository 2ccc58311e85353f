"""The OpenAI-compatible server on loopback (tiny random weights), driven by the official `openai` client."""
from __future__ import annotations

import asyncio
import base64
import io
import json
import socket
import struct
import threading
import time
import wave
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from chattts_velocity import Chat  # noqa: E402 (after the importorskip above)
from chattts_velocity.serve import ServerConfig, create_app  # noqa: E402 (after the importorskip above)
from chattts_velocity.serve.metrics import ENGINE_METRICS, SPEECH_METRICS  # noqa: E402 (after the importorskip above)
from chattts_velocity.serve.voice_fields import VoiceBook, speed_prompt  # noqa: E402 (after the importorskip above)

HOP = 256
KEY = "test-key-123"


class Server(NamedTuple):
    url: str
    state: object  # openai_api.ServerState


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tiny_chat(tiny_assets) -> Chat:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True)
    return chat


def _serve(app) -> tuple[uvicorn.Server, threading.Thread, str]:
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail("uvicorn did not start")
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def server(tiny_assets, tmp_path_factory) -> Iterator[Server]:
    # cache off: these tests compare repeated seeded requests, which must run the model each time
    config = ServerConfig(max_new_token=2000, max_input_chars=300, cache_mb=0,
                          voices_dir=str(tmp_path_factory.mktemp("voices")))
    app = create_app(lambda: _tiny_chat(tiny_assets), config)
    uv, thread, url = _serve(app)
    try:
        yield Server(url, app.state.server)
    finally:
        uv.should_exit = True
        thread.join(60)


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def speech_kwargs(steps: int = 30, seed: int = 1, **kw) -> dict:
    extra = kw.pop("extra", {})
    body = dict(model="tts-1", voice="alloy", input="Hello from the speech server.", response_format="wav")
    body.update(kw)
    return {**body, "extra_body": {"seed": seed, "max_new_tokens": steps, **extra}}


def parse_wav(data: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def assert_clip_length(samples: int, max_steps: int) -> None:
    """One piece of T steps decodes to exactly (2T - 1) * 256 samples."""
    assert samples % (2 * HOP) == HOP and samples <= (2 * max_steps - 1) * HOP


def metric(server: Server, name: str, **labels: str) -> float:
    """The sum of a family's samples whose labels include `labels` (prometheus_client's text format)."""
    text = httpx.get(server.url + "/metrics").text
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    values = [float(line.split()[-1]) for line in text.splitlines()
              if (line.startswith(name + " ") or line.startswith(name + "{")) and all(w in line for w in wanted)]
    assert values, f"{name} {labels} missing from /metrics"
    return sum(values)


def wait_until(condition, timeout: float = 180.0) -> None:  # a deadline for a hung test only
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


# ---- unit checks of the field mapping (no server) ------------------------------------------------
@pytest.mark.parametrize("speed,n", [(0.25, 0), (0.5, 2), (1.0, 5), (2.0, 8), (4.0, 9)])
def test_speed_maps_to_speed_token(speed: float, n: int) -> None:
    assert speed_prompt(speed) == f"[speed_{n}]"


def test_voice_book_resolves_names_seeds_and_strings() -> None:
    draws = iter(f"speaker-{i}" for i in range(100))
    book = VoiceBook(lambda seed: next(draws))
    assert book.resolve("alloy") == book.resolve("ALLOY") == book.resolve(1111) == book.resolve("1111")
    assert book.resolve(None) == book.resolve("default") != book.resolve("alloy")
    with pytest.raises(ValueError, match="voice"):
        book.resolve("no-such-voice")
    with pytest.raises(ValueError, match="speed"):
        speed_prompt(5.0)


# ---- the server ------------------------------------------------------------------------------------
@pytest.mark.e2e
def test_non_streamed_wav_is_valid_and_seeded(server: Server, client) -> None:
    whole = {"stream": False}  # asked for explicitly: the default is streamed
    a = parse_wav(client.audio.speech.create(**speech_kwargs(seed=7, extra=whole)).content)
    b = parse_wav(client.audio.speech.create(**speech_kwargs(seed=7, extra=whole)).content)
    c = parse_wav(client.audio.speech.create(**speech_kwargs(seed=7, voice="echo", extra=whole)).content)
    assert_clip_length(len(a), 30)
    assert np.array_equal(a, b) and np.abs(a).max() > 0
    assert not np.array_equal(a[: len(c)], c[: len(a)])  # another voice, another audio


@pytest.mark.e2e
def test_streamed_wav_and_pcm_equal_the_non_streamed_audio(server: Server, client) -> None:
    whole = parse_wav(client.audio.speech.create(**speech_kwargs(seed=3, extra={"stream": False})).content)
    kw = speech_kwargs(seed=3)  # no `stream`: streamed, as OpenAI's endpoint streams
    with client.audio.speech.with_streaming_response.create(**kw) as response:
        assert response.headers["content-type"] == "audio/wav" and "content-length" not in response.headers
        data = b"".join(response.iter_bytes())
    riff, riff_size, wave_tag = struct.unpack("<4sI4s", data[:12])
    data_tag, data_size = struct.unpack("<4sI", data[36:44])
    assert (riff, wave_tag, data_tag) == (b"RIFF", b"WAVE", b"data")
    assert (riff_size, data_size) == (0xFFFFFFFF, 0x7FFFF000)  # unknown length, as streamed (audio/formats.py)
    assert np.array_equal(np.frombuffer(data[44:], dtype="<i2"), whole)
    kw["response_format"] = "pcm"
    with client.audio.speech.with_streaming_response.create(**kw) as response:
        assert np.array_equal(np.frombuffer(response.read(), dtype="<i2"), whole)


@pytest.mark.e2e
def test_sse_stream_format(server: Server) -> None:
    body = {"input": "Hello there.", "voice": "nova", "response_format": "pcm", "stream_format": "sse",
            "seed": 2, "max_new_tokens": 20}
    events = [json.loads(line[6:]) for line in httpx.post(server.url + "/v1/audio/speech", json=body,
                                                          timeout=300).text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    usage = events[-1]["usage"]  # OpenAI's shape: prompt rows in, code steps out
    assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 20 + 1
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert all(e["type"] == "speech.audio.delta" for e in events[:-1])
    assert_clip_length(len(audio) // 2, 20)


@pytest.mark.e2e
def test_other_formats_decode(server: Server, client, decode_audio) -> None:
    assert {"wav", "pcm"} <= set(server.state.formats)
    wav = parse_wav(client.audio.speech.create(**speech_kwargs(steps=40, seed=4)).content)
    for fmt in ("flac", "mp3", "opus", "aac", "ogg"):
        if fmt not in server.state.formats:
            continue
        kw = speech_kwargs(steps=40, seed=4, response_format=fmt)
        if fmt == "mp3":
            kw.pop("response_format")  # OpenAI's default format
        audio, rate = decode_audio(client.audio.speech.create(**kw).content)
        assert rate == (48000 if fmt == "opus" else 24000)  # Opus decoders run at 48 kHz
        if fmt == "flac":  # lossless: the same samples as the WAV
            assert np.array_equal(audio, wav)
        else:  # lossy codecs pad a little at the edges
            assert abs(len(audio) * 24000 // rate - len(wav)) <= 4096


@pytest.mark.e2e
def test_voices_models_health(server: Server, client) -> None:
    voices = httpx.get(server.url + "/v1/audio/voices").json()
    assert {"alloy", "default"} <= set(voices["voices"])
    assert {m.id for m in client.models.list()} >= {"chattts", "tts-1"}
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


@pytest.mark.e2e
@pytest.mark.parametrize("kw,param", [
    ({"input": ""}, "input"),
    ({"input": "   "}, "input"),
    ({"response_format": "aiff"}, "response_format"),
    ({"input": "x" * 301}, "input"),
    ({"voice": "nobody"}, "voice"),
    ({"speed": 9.0}, "speed"),
    ({"extra": {"temperature": -1.0}}, "temperature"),
    ({"extra": {"max_new_tokens": 5000}}, "max_new_tokens"),
    ({"extra": {"min_new_tokens": 40}}, "min_new_tokens"),
])
def test_bad_requests_get_openai_errors(server: Server, client, kw: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.audio.speech.create(**speech_kwargs(**kw))
    assert err.value.status_code == 400
    error = err.value.body if "message" in err.value.body else err.value.body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert error["type"] == "invalid_request_error" and param.split("_")[0] in error["message"]


@pytest.mark.e2e
@pytest.mark.parametrize("fields, param", [
    ('"temperature": NaN', "temperature"), ('"top_p": NaN', "top_p"), ('"top_k": 9223372036854775808', "top_k"),
    ('"seed": true', "seed"), ('"seed": -1', "seed"), ('"seed": 9223372036854775808', "seed"),
])
def test_hostile_sampling_values_get_400_and_the_engine_lives_on(server: Server, client, fields: str,
                                                                  param: str) -> None:
    body = '{"input": "Hello.", "voice": "alloy", "response_format": "wav", ' + fields + "}"
    reply = httpx.post(server.url + "/v1/audio/speech", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param
    assert_clip_length(len(parse_wav(client.audio.speech.create(**speech_kwargs(steps=6)).content)), 6)


@pytest.mark.e2e
def test_unknown_fields_are_ignored(server: Server, client) -> None:
    kw = speech_kwargs(steps=10)
    kw["extra_body"]["not_a_field"] = 1
    assert_clip_length(len(parse_wav(client.audio.speech.create(**kw).content)), 10)


@pytest.mark.e2e
@pytest.mark.parametrize("fmt,stream", [("wav", False), ("pcm", True)])
def test_a_seeded_request_gives_the_same_bytes_alone_and_among_concurrent_requests(server: Server, fmt: str,
                                                                                   stream: bool) -> None:
    """Cache off: the request alone, again alone, and in the middle of 8 concurrent others (shared engine steps and,
    streamed, the decode thread's windows) gives the same bytes."""
    def body(i: int) -> dict:
        text = "The request we follow, word for word." if i == 4 else f"Concurrent neighbour number {i}."
        return {"model": "tts-1", "voice": "alloy", "input": text, "response_format": fmt, "stream": stream,
                "seed": 5 if i == 4 else 200 + i, "max_new_tokens": 40, "min_new_tokens": 40 - 3 * (i % 4)}

    def alone() -> bytes:
        response = httpx.post(server.url + "/v1/audio/speech", json=body(4), timeout=300)
        assert response.status_code == 200
        return response.content

    async def among() -> list[bytes]:
        async with httpx.AsyncClient(timeout=600) as ac:
            calls = [ac.post(server.url + "/v1/audio/speech", json=body(i)) for i in range(9)]
            return [r.content for r in await asyncio.gather(*calls)]

    first = alone()
    assert len(first) > 2 * HOP and alone() == first
    together = asyncio.run(among())
    assert together[4] == first
    assert together[3] != first


@pytest.mark.e2e
def test_32_concurrent_clients_share_batches(server: Server) -> None:
    steps_before = metric(server, ENGINE_METRICS["num_shared_steps"].sample)

    async def main() -> list[bytes]:
        aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)
        calls = [aclient.audio.speech.create(**speech_kwargs(steps=20 + i % 8, seed=100 + i,
                                                             input=f"Concurrent client number {i}."))
                 for i in range(32)]
        return [r.content for r in await asyncio.gather(*calls)]

    results = asyncio.run(main())
    for i, data in enumerate(results):
        audio = parse_wav(data)
        assert_clip_length(len(audio), 20 + i % 8)
        assert np.abs(audio).max() > 0
    assert metric(server, ENGINE_METRICS["max_batch_size"].sample) >= 8
    assert metric(server, ENGINE_METRICS["num_shared_steps"].sample) - steps_before >= 20
    assert metric(server, ENGINE_METRICS["kv_blocks_used"].sample) == 0
    assert metric(server, SPEECH_METRICS["time_to_first_audio"].name + "_count") >= 32


@pytest.mark.e2e
def test_client_disconnect_mid_stream_aborts_and_frees_blocks(server: Server, client) -> None:
    engine = server.state.engine
    aborted = engine.stats.num_aborted
    kw = speech_kwargs(steps=1800, seed=5, extra={"min_new_tokens": 1800, "stream": True})
    with client.audio.speech.with_streaming_response.create(**kw) as response:
        first = next(response.iter_bytes())
        assert first[:4] == b"RIFF"
        wait_until(lambda: engine.engine.block_manager.num_used_blocks > 0)
    # leaving the block closes the connection long before 1800 steps are generated
    wait_until(lambda: engine.stats.num_aborted == aborted + 1)
    wait_until(lambda: engine.engine.block_manager.num_used_blocks == 0)
    assert not engine.engine.has_unfinished_requests()
    responses = SPEECH_METRICS["responses"].sample
    assert metric(server, responses, status="disconnect", format="wav", voice_kind="preset") >= 1


@pytest.mark.e2e
def test_client_timeout_on_a_non_streamed_request_aborts_it(server: Server) -> None:
    engine = server.state.engine
    aborted = engine.stats.num_aborted
    body = {"input": "A long request nobody waits for.", "voice": "sage", "response_format": "wav",
            "max_new_tokens": 1800, "min_new_tokens": 1800, "seed": 6, "stream": False}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/audio/speech", json=body, timeout=1.5)
    wait_until(lambda: engine.stats.num_aborted == aborted + 1)
    wait_until(lambda: engine.engine.block_manager.num_used_blocks == 0)


@pytest.mark.e2e
def test_api_key(tiny_assets) -> None:
    app = create_app(lambda: _tiny_chat(tiny_assets), ServerConfig(api_key=KEY, max_new_token=20))
    uv, thread, url = _serve(app)
    try:
        wrong = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as err:
            wrong.models.list()
        assert err.value.status_code == 401
        error = err.value.body if "message" in err.value.body else err.value.body["error"]
        assert error["code"] == "invalid_api_key"
        missing = httpx.post(url + "/v1/audio/speech", json={"input": "hi", "voice": "alloy"})
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
        ok = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        assert_clip_length(len(parse_wav(ok.audio.speech.create(**speech_kwargs(steps=10)).content)), 10)
        assert httpx.get(url + "/health").status_code == 200  # probes need no key
    finally:
        uv.should_exit = True
        thread.join(60)


# ---- the edge: refusals before the body is read, malformed bodies, bounded work --------------------------
@pytest.fixture(scope="module")
def guarded(tiny_assets) -> Iterator[str]:
    config = ServerConfig(api_key=KEY, max_new_token=20, max_body_bytes=4096, max_pieces=8)
    app = create_app(lambda: _tiny_chat(tiny_assets), config)
    uv, thread, url = _serve(app)
    try:
        yield url
    finally:
        uv.should_exit = True
        thread.join(60)


def raw_request(url: str, head: str, body: bytes = b"", timeout: float = 10.0) -> tuple[int, dict]:
    """A hand-made HTTP/1.1 request (to declare a body larger than what is sent); returns (status, JSON)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(head.encode() + b"\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < int(
                [h for h in data.split(b"\r\n") if h.lower().startswith(b"content-length:")][0].split(b":")[1]):
            data += s.recv(65536)
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1])


@pytest.mark.e2e
def test_the_key_is_checked_before_a_huge_body_is_read(guarded: str) -> None:
    head = ("POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Authorization: Bearer wrong\r\nContent-Length: 1000000000\r\n")
    status, body = raw_request(guarded, head, b'{"input": "')  # 1 GB declared, 11 bytes sent: no waiting
    assert status == 401 and body["error"]["code"] == "invalid_api_key"


@pytest.mark.e2e
def test_an_oversized_body_is_413_before_parsing(guarded: str) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    big = {"input": "x" * 10000, "voice": "alloy"}
    declared = httpx.post(guarded + "/v1/audio/speech", json=big, headers=auth)
    assert declared.status_code == 413 and declared.json()["error"]["code"] == "request_too_large"
    chunked = httpx.post(guarded + "/v1/audio/speech", content=(b"x" * 1000 for _ in range(10)),
                         headers={**auth, "Content-Type": "application/json"})
    assert chunked.status_code == 413
    ok = httpx.post(guarded + "/v1/audio/speech", headers=auth,
                    json={"input": "Still fine.", "voice": "alloy", "response_format": "wav", "max_new_tokens": 5})
    assert ok.status_code == 200 and assert_clip_length(len(parse_wav(ok.content)), 5) is None


@pytest.mark.e2e
def test_malformed_json_and_too_many_pieces_are_clean_400s(guarded: str) -> None:
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    broken = httpx.post(guarded + "/v1/audio/speech", content=b'{"input": "unterminated', headers=auth)
    assert broken.status_code == 400 and broken.json()["error"]["message"].startswith("body: is not valid JSON")
    many = httpx.post(guarded + "/v1/audio/speech", headers=auth, json={"input": "Go. " * 40, "voice": "alloy"})
    error = many.json()["error"]
    assert many.status_code == 400 and error["param"] == "input" and "over the limit of 8" in error["message"]


def test_the_key_can_come_from_the_environment(tiny_assets, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATTTS_VELOCITY_API_KEY", KEY)
    assert ServerConfig().api_key == KEY
    monkeypatch.delenv("CHATTTS_VELOCITY_API_KEY")
    assert ServerConfig().api_key is None


@pytest.mark.e2e
def test_saved_voices_instructions_and_models_through_the_openai_client(server: Server, client) -> None:
    state = server.state
    speaker = state.pipeline.speakers.random()
    created = httpx.post(server.url + "/v1/audio/voices", json={"name": "e2e voice", "speaker": speaker,
                                                                "overwrite": True})
    assert created.status_code == 201
    try:
        by_name = parse_wav(client.audio.speech.create(**speech_kwargs(voice={"id": "e2e voice"})).content)
        by_string = parse_wav(client.audio.speech.create(**speech_kwargs(voice=speaker)).content)
        assert np.array_equal(by_name, by_string)
        shaped = client.audio.speech.create(**speech_kwargs(voice="e2e voice", instructions="slow, oral 2, break 3"))
        assert len(parse_wav(shaped.content)) > 0
        free = client.audio.speech.with_raw_response.create(**speech_kwargs(instructions="Sound excited, speak fast."))
        assert free.headers["x-chattts-instructions-applied"] == "speed 7"
        assert free.headers["x-chattts-instructions-ignored"] == "sound excited"  # accepted and reported
        assert len(parse_wav(free.content)) > 0
        with pytest.raises(openai.NotFoundError) as missing:
            client.audio.speech.create(**speech_kwargs(model="tts-2"))
        assert missing.value.body["code"] == "model_not_found"
    finally:
        httpx.delete(server.url + "/v1/audio/voices/e2e voice")
