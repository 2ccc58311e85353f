"""A streamed request keeps at most its window of sentence pieces in the engine, counted from the piece its reader
is on: a reader that stops after its first chunk leaves the later pieces unstarted, the send timeout still ends it
with nothing running and no KV block in use, and a reader that reads everything gets the same audio as with every
piece started at once (tiny random weights)."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import numpy as np
import pytest

from chattts_velocity import Chat, InferCodeParams
from chattts_velocity.engine.async_engine import AsyncLLMEngine
from chattts_velocity.serve.service import SpeechService

TEXT = " ".join(f"Sentence number {k} is here." for k in range(6))


@pytest.fixture(scope="module")
def chat(tiny_assets) -> Chat:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True)
    return chat


def params() -> InferCodeParams:
    return InferCodeParams(manual_seed=5, max_new_token=12, min_new_token=12, show_tqdm=False)


async def wait_for(done: Callable[[], bool], timeout: float = 120.0) -> None:  # a deadline for a hung test only
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def idle(engine: AsyncLLMEngine) -> bool:
    return not engine.engine.has_unfinished_requests() and engine.engine.block_manager.num_used_blocks == 0


def test_a_reader_that_stops_leaves_the_pieces_past_its_window_unstarted(chat: Chat) -> None:
    engine = AsyncLLMEngine(chat.pipeline.stages.engine())
    service = SpeechService(chat.pipeline, engine)
    assert len(service.pieces(TEXT).texts) == 6

    async def scenario() -> int:
        before = engine.stats.num_requests
        stream = await service.open(TEXT, params(), window=2)
        chunks = stream.__aiter__()
        await chunks.__anext__()  # the first chunk; then the reader stops
        await wait_for(lambda: idle(engine))  # the window's two pieces generated to the end, nothing else
        await asyncio.sleep(0.3)
        started = engine.stats.num_requests - before
        await chunks.aclose()
        return started

    try:
        assert asyncio.run(scenario()) == 2
        assert idle(engine) and not engine.engine.scheduler.running
    finally:
        engine.shutdown()
        service.shutdown()


def test_a_reader_that_reads_everything_gets_the_same_audio_with_a_window(chat: Chat) -> None:
    engine = AsyncLLMEngine(chat.pipeline.stages.engine())
    service = SpeechService(chat.pipeline, engine)

    async def audio(window: int | None) -> np.ndarray:
        stream = await service.open(TEXT, params(), window=window)
        pieces = [chunk async for chunk in stream]
        assert len(stream.timeline.stamps) == 6
        return np.concatenate(pieces)

    try:
        windowed, at_once = asyncio.run(audio(2)), asyncio.run(audio(None))
        assert len(windowed) > 0 and windowed.tobytes() == at_once.tobytes()
    finally:
        engine.shutdown()
        service.shutdown()


def test_the_send_timeout_ends_a_stalled_stream_with_its_later_pieces_never_started(chat: Chat, tmp_path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from chattts_velocity.serve import ServerConfig, create_app

    config = ServerConfig(voices_dir=str(tmp_path), warmup_steps=0, max_new_token=1024, cache_mb=0,
                          send_timeout_s=0.5, stream_window_pieces=2)
    body = json.dumps({"model": "chattts", "input": TEXT, "voice": "alloy", "response_format": "pcm", "stream": True,
                       "seed": 1, "min_new_tokens": 1024}).encode()  # pieces that still generate at the timeout
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/audio/speech", "raw_path": b"/v1/audio/speech", "root_path": "", "query_string": b"",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}
    sent: list[dict] = []
    bodies = [body]

    async def receive() -> dict:
        if not bodies:
            await asyncio.sleep(3600)  # no disconnect: the client is there, it just does not read
        return {"type": "http.request", "body": bodies.pop(), "more_body": False}

    async def stalled_client(message: dict) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            await asyncio.sleep(3600)  # the first audio bytes went out; the client reads no more

    with TestClient(create_app(chat, config)) as client:
        engine = client.app.state.server.engine

        async def scenario() -> tuple[int, int]:
            before, aborted = engine.stats.num_requests, engine.stats.num_aborted
            await client.app(scope, receive, stalled_client)
            await wait_for(lambda: idle(engine))
            return engine.stats.num_requests - before, engine.stats.num_aborted - aborted

        started, aborted = client.portal.call(scenario)
        assert started == 2 and aborted == 2  # the window's pieces, aborted by the timeout
        assert sent[0]["status"] == 200 and not engine.engine.scheduler.running
        assert engine.engine.block_manager.num_used_blocks == 0


def test_a_piece_past_the_window_too_long_for_the_engine_is_refused_at_open(chat: Chat, tiny_assets) -> None:
    from chattts_velocity import load_pretrained

    pipeline = chat.pipeline
    engine = AsyncLLMEngine(load_pretrained(tiny_assets, is_vllm=True, max_model_len=64).engine)
    service = SpeechService(pipeline, engine)
    text = "Short one. " + "and on " * 40 + "it ends."  # the second piece passes 64 positions

    async def scenario() -> None:
        with pytest.raises(ValueError, match="max_new_token"):
            await service.open(text, params(), window=1)

    try:
        asyncio.run(scenario())
        assert engine.stats.num_requests == 0 and idle(engine)
    finally:
        engine.shutdown()
        service.shutdown()
