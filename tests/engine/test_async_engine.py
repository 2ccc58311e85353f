"""AsyncLLMEngine on tiny random weights: shared steps, same codes as the sync engine, cancel frees blocks."""
from __future__ import annotations

import asyncio
import time

import pytest
import torch

from chattts_velocity import load_pretrained
from chattts_velocity.assets import AssetPaths
from chattts_velocity.engine.async_engine import AsyncLLMEngine
from chattts_velocity.schema import Prompt, SamplingParams
from chattts_velocity.text import Tokenizer

TEXTS = ["Hello world.", "A second request.", "你好，今天天气很好。", "Number four is a little longer."]


@pytest.fixture(scope="module")
def tokenizer(tiny_assets) -> Tokenizer:
    return Tokenizer(AssetPaths.from_root(tiny_assets).tokenizer_dir)


def fresh_engine(tiny_assets):
    return load_pretrained(tiny_assets, is_vllm=True).engine


def prompts(tokenizer: Tokenizer, texts: list[str]) -> list[Prompt]:
    return [tokenizer.code_prompt(t) for t in texts]


def forced(seed: int, steps: int) -> SamplingParams:
    """Exactly `steps` generated steps (random weights rarely emit EOS; min_new_token forbids it)."""
    return SamplingParams(seed=seed, max_new_token=steps, min_new_token=steps)


async def collect(engine: AsyncLLMEngine, prompt: Prompt, params: SamplingParams) -> list:
    return [delta async for delta in engine.generate(prompt, params)]


async def wait_for(condition, timeout: float = 120.0) -> None:  # a deadline for a hung test only
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


def test_concurrent_requests_share_steps_and_match_the_sync_engine(tiny_assets, tokenizer) -> None:
    ps = prompts(tokenizer, TEXTS)
    params = [forced(seed=i, steps=12 + 3 * i) for i in range(len(ps))]
    reference = load_pretrained(tiny_assets, is_vllm=True).generate(ps, params, progress=False)
    engine = AsyncLLMEngine(fresh_engine(tiny_assets))

    async def main() -> list[list]:
        return await asyncio.gather(*(collect(engine, p, sp) for p, sp in zip(ps, params, strict=True)))

    try:
        results = asyncio.run(main())
    finally:
        engine.shutdown()
    for deltas, ref, sp in zip(results, reference, params, strict=True):
        assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
        assert all(len(d.token_ids) <= 1 for d in deltas)  # deltas, not cumulative outputs
        tokens = torch.cat([d.token_ids for d in deltas])
        hidden = torch.cat([d.hidden for d in deltas if d.hidden is not None])
        assert len(tokens) == sp.max_new_token and deltas[-1].finish_reason == "length"
        assert torch.equal(tokens, ref.token_ids)
        assert torch.allclose(hidden, ref.hidden, atol=1e-5)
    assert engine.stats.max_batch_size == len(ps)
    assert engine.stats.num_shared_steps >= 12
    assert engine.stats.num_finished == len(ps) and engine.stats.num_aborted == 0


def test_request_joins_the_running_batch(tiny_assets, tokenizer) -> None:
    first, second = prompts(tokenizer, TEXTS[:2])
    engine = AsyncLLMEngine(fresh_engine(tiny_assets))

    async def main() -> tuple[int, list]:
        seen = 0
        late = None
        async for _ in engine.generate(first, forced(1, 40)):
            seen += 1
            if seen == 5:  # the first request is mid-flight when the second arrives
                late = asyncio.create_task(collect(engine, second, forced(2, 10)))
        return seen, await late

    try:
        seen, late = asyncio.run(main())
    finally:
        engine.shutdown()
    assert seen == 40 and len(late) == 10  # a length finish rides on the last step's delta
    assert engine.stats.max_batch_size == 2


def test_closing_the_consumer_aborts_and_frees_blocks(tiny_assets, tokenizer) -> None:
    engine = AsyncLLMEngine(fresh_engine(tiny_assets))
    blocks = engine.engine.block_manager

    async def main() -> None:
        agen = engine.generate(prompts(tokenizer, TEXTS[:1])[0], forced(3, 500))
        for _ in range(3):
            await agen.__anext__()
        assert blocks.num_used_blocks > 0
        await agen.aclose()
        await wait_for(lambda: engine.stats.num_aborted == 1 and blocks.num_used_blocks == 0)
        assert not engine.engine.has_unfinished_requests()
        after = await collect(engine, prompts(tokenizer, TEXTS[1:2])[0], forced(4, 5))  # still serving
        assert len(after) == 5

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()


def test_cancelling_the_consumer_task_aborts(tiny_assets, tokenizer) -> None:
    engine = AsyncLLMEngine(fresh_engine(tiny_assets))
    blocks = engine.engine.block_manager

    async def main() -> None:
        started = asyncio.Event()

        async def consume() -> None:
            async for _ in engine.generate(prompts(tokenizer, TEXTS[2:3])[0], forced(5, 500)):
                started.set()

        tasks = [asyncio.create_task(consume()) for _ in range(3)]
        await started.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await wait_for(lambda: engine.stats.num_aborted == 3 and blocks.num_used_blocks == 0)
        assert engine.metrics()["num_running"] == 0 and engine.metrics()["num_waiting"] == 0

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()


def test_bad_request_raises_at_add_and_engine_keeps_serving(tiny_assets, tokenizer) -> None:
    engine = AsyncLLMEngine(fresh_engine(tiny_assets))
    prompt = prompts(tokenizer, TEXTS[:1])[0]
    too_long = SamplingParams(max_new_token=engine.engine.engine_config.max_model_len)

    async def main() -> None:
        with pytest.raises(ValueError, match="max_model_len"):
            await collect(engine, prompt, too_long)
        assert len(await collect(engine, prompt, forced(1, 3))) == 3

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
    assert engine.stats.num_requests == 1


def test_shutdown_fails_pending_requests_and_start_restarts(tiny_assets, tokenizer) -> None:
    engine = AsyncLLMEngine(fresh_engine(tiny_assets))
    prompt = prompts(tokenizer, TEXTS[:1])[0]

    async def main() -> None:
        agen = engine.generate(prompt, forced(1, 500))
        await agen.__anext__()
        await asyncio.to_thread(engine.shutdown)
        assert not engine.is_running
        with pytest.raises(RuntimeError, match="shut down"):
            async for _ in agen:
                pass
        assert engine.engine.block_manager.num_used_blocks == 0
        assert len(await collect(engine, prompt, forced(1, 3))) == 3  # a new request restarts the loop

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
