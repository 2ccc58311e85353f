"""One request's fault fails that request only: the engine, its other requests and their outputs go on unchanged."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from chattts_velocity import Chat, InferCodeParams
from chattts_velocity.engine.async_engine import AsyncLLMEngine
from chattts_velocity.schema import SamplingParams

TEXTS = ["The first good text.", "A request whose processor breaks.", "The second good text.", "And a third one."]


def explode_at(step: int):
    def processor(history: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if len(history) >= step:
            raise RuntimeError("user code exploded")
        return logits
    return processor


@pytest.fixture(scope="module")
def chat(tiny_assets) -> Chat:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True)
    return chat


def forced(seed: int, **kw) -> InferCodeParams:
    return InferCodeParams(manual_seed=seed, max_new_token=16, min_new_token=16, show_tqdm=False, **kw)


def test_a_raising_processor_fails_its_request_and_the_others_finish_unchanged(chat: Chat) -> None:
    params = [forced(1), forced(2, logits_processors=(explode_at(5),)), forced(3), forced(4)]
    results = dict(chat.infer_many(TEXTS, params))
    assert isinstance(results[1], ValueError)
    assert "logits_processors: RuntimeError: user code exploded" in str(results[1])
    alone = dict(chat.infer_many([TEXTS[i] for i in (0, 2, 3)], [params[i] for i in (0, 2, 3)]))
    for k, i in enumerate((0, 2, 3)):
        assert len(results[i]) == (2 * 16 - 1) * 256
        np.testing.assert_allclose(results[i], alone[k], atol=1e-5)  # same codes; fp rounding of the batch only
    engine = chat.engine()
    assert not engine.has_unfinished_requests() and engine.block_manager.num_used_blocks == 0


def test_whole_batch_calls_raise_the_request_s_error(chat: Chat) -> None:
    with pytest.raises(ValueError, match="logits_processors"):
        chat.infer(TEXTS[:1], skip_refine_text=True, params_infer_code=forced(1, logits_processors=(explode_at(0),)))
    with pytest.raises(ValueError, match="logits_processors"):
        list(chat.infer(TEXTS[:1], stream=True, skip_refine_text=True,
                        params_infer_code=forced(1, logits_processors=(explode_at(2),))))
    assert chat.engine().block_manager.num_used_blocks == 0
    assert len(chat.infer(TEXTS[:1], skip_refine_text=True, params_infer_code=forced(1))[0]) > 0  # still serving


def test_the_async_engine_fails_one_consumer_and_serves_the_rest(chat: Chat) -> None:
    engine = AsyncLLMEngine(chat.engine())
    requests = chat.speech_requests(chat.split(TEXTS[:3], split_text=False),
                                    [forced(1), forced(2, logits_processors=(explode_at(3),)), forced(3)])

    async def collect(prompt, sampling: SamplingParams) -> list:
        return [d async for d in engine.generate(prompt, sampling)]

    async def main() -> list:
        return await asyncio.gather(*(collect(p, s) for p, s in zip(requests.prompts, requests.sampling, strict=True)),
                                    return_exceptions=True)

    try:
        good_a, bad, good_b = asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        engine.shutdown()
    assert isinstance(bad, ValueError) and "user code exploded" in str(bad)
    assert sum(len(d.token_ids) for d in good_a) == 16 and sum(len(d.token_ids) for d in good_b) == 16
    assert engine.error is None and chat.engine().block_manager.num_used_blocks == 0


def test_a_step_that_raises_fails_the_requests_it_held_and_the_engine_goes_on(chat: Chat, monkeypatch) -> None:
    runner = chat.engine().runner
    real_run, calls = runner.run, []

    def run_failing_once(batch):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected device fault")
        return real_run(batch)

    monkeypatch.setattr(runner, "run", run_failing_once)
    results = dict(chat.infer_many(TEXTS[:2], [forced(1), forced(2)]))
    assert all(isinstance(r, RuntimeError) and "injected device fault" in str(r) for r in results.values())
    assert chat.engine().block_manager.num_used_blocks == 0
    assert len(chat.infer(TEXTS[:1], skip_refine_text=True, params_infer_code=forced(1))[0]) > 0


def test_max_position_embeddings_bounds_max_model_len(tiny_assets) -> None:
    from chattts_velocity import load_pretrained

    engine = load_pretrained(tiny_assets, is_vllm=True, max_model_len=10**6).engine
    assert engine.engine_config.max_model_len == engine.config.max_position_embeddings
