"""Chat from several threads (tiny random weights): calls take the model in turn and give the audio they give
alone; interrupt() stops the calls in flight, not the ones made afterwards; text with nothing to say is refused."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from chattts_velocity import Chat, InferCodeParams
from chattts_velocity.text import EmptyText

STEPS = 10


@pytest.fixture(scope="module")
def chat(tiny_assets) -> Chat:
    chat = Chat()
    assert chat.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True)
    return chat


def forced(seed: int, steps: int = STEPS) -> InferCodeParams:
    return InferCodeParams(manual_seed=seed, max_new_token=steps, min_new_token=steps, show_tqdm=False)


def test_eight_threads_get_the_audio_each_gets_alone(chat: Chat) -> None:
    alone = {seed: chat.infer(f"Thread {seed} speaks.", skip_refine_text=True, params_infer_code=forced(seed))[0]
             for seed in range(8)}

    def call(seed: int) -> np.ndarray:
        if seed % 2:  # streams and whole calls mixed
            chunks = chat.infer(f"Thread {seed} speaks.", stream=True, skip_refine_text=True,
                                params_infer_code=forced(seed))
            return np.concatenate([c[0] for c in chunks])
        return chat.infer(f"Thread {seed} speaks.", skip_refine_text=True, params_infer_code=forced(seed))[0]

    with ThreadPoolExecutor(8) as pool:
        together = dict(zip(range(8), pool.map(call, range(8)), strict=True))
    for seed in range(8):
        assert np.array_equal(together[seed], alone[seed]), seed
    engine = chat.engine()
    assert not engine.has_unfinished_requests() and engine.block_manager.num_used_blocks == 0


def test_interrupt_stops_the_calls_in_flight_and_not_later_ones(chat: Chat) -> None:
    long = forced(1, steps=400)
    started, results = threading.Event(), {}

    def running() -> None:
        chunks = chat.infer("A long one.", stream=True, skip_refine_text=True, params_infer_code=long)
        for _ in chunks:
            started.set()
        results["running"] = chunks

    def waiting() -> None:
        started.wait(30)
        results["waiting"] = chat.infer("Waiting.", skip_refine_text=True, params_infer_code=long)[0]

    threads = [threading.Thread(target=running), threading.Thread(target=waiting)]
    for t in threads:
        t.start()
    assert started.wait(60)
    while chat.pipeline.stages.gate.in_flight < 2:  # the second call is queued behind the first
        threading.Event().wait(0.01)
    chat.interrupt()
    for t in threads:
        t.join(60)
    assert len(results["waiting"]) < (2 * 400 - 1) * 256  # stopped, although it had not started
    later = chat.infer("After.", skip_refine_text=True, params_infer_code=forced(2))[0]
    assert len(later) == (2 * STEPS - 1) * 256  # the interrupt was not left behind for the next call


def test_a_thread_cannot_start_a_call_inside_its_own_open_stream(chat: Chat) -> None:
    stream = chat.infer("Open stream.", stream=True, skip_refine_text=True, params_infer_code=forced(3))
    next(stream)
    with pytest.raises(RuntimeError, match="still holds the model"):
        chat.infer("Nested.", skip_refine_text=True, params_infer_code=forced(3))
    stream.close()
    assert len(chat.infer("Now.", skip_refine_text=True, params_infer_code=forced(3))[0]) > 0


@pytest.mark.parametrize("text", ["\u200b\u200c\u200d", "\x00\x00", "\u0301\u0302", "\u00ad\u00ad",
                                  "\u202e\u202d", "\ufe0f\ufe0e", "🙂🙂", "。。，，", "[uv_break]"])
def test_text_that_normalises_to_nothing_is_refused(chat: Chat, text: str) -> None:
    with pytest.raises(EmptyText, match=r"^text\[0\]: holds nothing to say"):
        chat.infer(text, skip_refine_text=True, params_infer_code=forced(1))
    results = dict(chat.infer_many(["Fine.", text], [forced(1), forced(1)]))
    assert isinstance(results[1], EmptyText) and isinstance(results[0], np.ndarray)
