"""A synthesis job's verbs (speech/synthesis.py): run is its stream collected, the async verbs give the same audio,
and cancel() ends the call early."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from chattts_velocity.params import InferCodeParams
from chattts_velocity.speech import SpeechPipeline, StreamOptions, SynthesisJob

TEXTS = ["Hello there. The second sentence is here.", "Another one."]
EXACT = StreamOptions(chunk_steps=4, first_chunk_steps=None, first_lookahead_steps=None, max_chunk_steps=None)


@pytest.fixture(scope="module")
def pipeline(tiny_assets) -> SpeechPipeline:
    return SpeechPipeline.load(tiny_assets, device="cpu", gpt="velocity")


def job(steps: int = 12, **options: object) -> SynthesisJob:
    params = InferCodeParams(max_new_token=steps, min_new_token=steps, manual_seed=5, show_tqdm=False)
    return SynthesisJob(TEXTS, params, **options)  # type: ignore[arg-type]


def test_run_is_the_stream_collected_and_the_async_verbs_give_the_same_audio(pipeline) -> None:
    whole = pipeline.synthesis(job(48)).run()
    streamed = list(pipeline.synthesis(job(48)).stream())
    assert len(streamed) == 1 and all((a == b).all() for a, b in zip(whole, streamed[0], strict=True))
    assert all((a == b).all() for a, b in zip(whole, asyncio.run(pipeline.synthesis(job(48)).arun()), strict=True))

    async def chunks() -> list[list[np.ndarray]]:
        return [c async for c in pipeline.synthesis(job(48, shape="chunks"), EXACT).astream()]

    windows = asyncio.run(chunks())
    assert len(windows) > 1  # chunks as made, not one clip at the end
    joined = [np.concatenate([w[i] for w in windows]) for i in range(len(TEXTS))]
    assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(whole, joined, strict=True))
    assert all(len(a) == len(b) for a, b in zip(whole, joined, strict=True))


def test_a_cancelled_synthesis_ends_early_with_what_it_has(pipeline) -> None:
    full = pipeline.synthesis(job(steps=48, shape="chunks"), EXACT)
    assert sum(len(c[0]) for c in full.stream()) > 0
    cancelled = pipeline.synthesis(job(steps=48, shape="chunks"), EXACT)
    stream = cancelled.stream()
    first = next(stream)
    cancelled.cancel()
    rest = list(stream)
    whole = pipeline.synthesis(job(steps=48)).run()
    got = len(first[0]) + sum(len(c[0]) for c in rest)
    assert got < len(whole[0])  # stopped after its current step, not at 40 steps


def test_a_bad_shape_is_one_value_error_naming_shape() -> None:
    with pytest.raises(ValueError, match="^shape: must be one of whole, chunks"):
        job(shape="bytes")
