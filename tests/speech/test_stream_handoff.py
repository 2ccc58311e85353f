"""stream_texts over a GPT that hands rows on in chunks (LLM.stream): the same audio, and no chunk later than with a
hand-off every step (the windows' due row counts are handed on at once)."""
from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from chattts_velocity import Chat, InferCodeParams
from chattts_velocity.engine.llm import LLM
from chattts_velocity.speech.streams import StreamOptions, StreamSet, stream_texts
from chattts_velocity.text import split_pieces

TEXTS = ["Hello world, streamed in chunks.", "Another text."]
STEPS = 60


@pytest.fixture(scope="module")
def chat(tiny_assets) -> Chat:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True)
    return chat


class EveryStep:
    """The LLM with a hand-off every step (chunk_steps 1, no due rows): the reference timing."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm

    def stream(self, prompts, params, chunk_steps, should_stop=None, due_rows=()) -> Iterator:  # noqa: ANN001
        return self.llm.stream(prompts, params, 1, should_stop)


def _run(chat: Chat, gpt, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, list[np.ndarray]]]:  # noqa: ANN001
    """(engine steps so far, the yield) for each yield of stream_texts with the default StreamOptions."""
    engine = chat.engine()
    steps = [0]
    step_deltas = engine.step_deltas

    def counted():
        steps[0] += 1
        return step_deltas()

    monkeypatch.setattr(engine, "step_deltas", counted)
    params = InferCodeParams(manual_seed=4, max_new_token=STEPS, min_new_token=STEPS, show_tqdm=False)
    requests = chat.speech_requests(split_pieces(TEXTS, split=False), params)
    out = [(steps[0], y) for y in stream_texts(StreamSet(StreamOptions()), gpt, requests,
                                                chat.pipeline.stages.mel("decoder"))]
    monkeypatch.undo()
    return out


def test_chunked_hand_offs_give_the_same_audio_no_later(chat: Chat, monkeypatch: pytest.MonkeyPatch) -> None:
    llm = chat.gpt(True)
    assert isinstance(llm, LLM)
    reference = _run(chat, EveryStep(llm), monkeypatch)
    chunked = _run(chat, llm, monkeypatch)
    for k in range(len(TEXTS)):
        # each text's audio: the same samples, and every sample out at the same engine step as with per-step hand-offs
        ref_at = [(at, len(y[k])) for at, y in reference if len(y[k])]
        got_at = [(at, len(y[k])) for at, y in chunked if len(y[k])]
        assert got_at == ref_at and len(ref_at) >= 3
        np.testing.assert_array_equal(np.concatenate([y[k] for _, y in chunked]),
                                      np.concatenate([y[k] for _, y in reference]))
    assert reference[0][0] == 4 + 24  # StreamOptions' first chunk + first lookahead (rows: one per step)
    assert len(chunked) == len(reference)
