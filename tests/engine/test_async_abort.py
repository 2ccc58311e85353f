"""AsyncLLMEngine.abort ends the consumer's stream (vLLM's abort cases), and a failing step fails only its requests."""
from __future__ import annotations

import asyncio

import pytest

from chattts_velocity import load_pretrained
from chattts_velocity.assets import AssetPaths
from chattts_velocity.engine.async_engine import AsyncLLMEngine
from chattts_velocity.engine.sched.step import StepDeltas
from chattts_velocity.schema import GenerationOutput, Prompt, SamplingParams
from chattts_velocity.text import Tokenizer


@pytest.fixture(scope="module")
def prompt(tiny_assets) -> Prompt:
    return Tokenizer(AssetPaths.from_root(tiny_assets).tokenizer_dir).code_prompt("Abort me, please.")


@pytest.fixture
def engine(tiny_assets):
    engine = AsyncLLMEngine(load_pretrained(tiny_assets, is_vllm=True).engine)
    yield engine
    engine.shutdown()


def forced(steps: int, seed: int = 1) -> SamplingParams:
    return SamplingParams(seed=seed, max_new_token=steps, min_new_token=steps)


async def consume(engine: AsyncLLMEngine, prompt: Prompt, params: SamplingParams, abort_after: int | None,
                  ) -> list[GenerationOutput]:
    """Deltas of one request; after `abort_after` deltas (0: right after it was queued) abort it."""
    stream = await engine.add_request(prompt, params)
    if abort_after == 0:
        engine.abort(stream.request_id)
    deltas = []
    async for delta in engine.outputs(stream):
        deltas.append(delta)
        if abort_after is not None and len(deltas) == abort_after:
            engine.abort(stream.request_id)
    return deltas


def assert_clean(engine: AsyncLLMEngine) -> None:
    assert engine.engine.block_manager.num_used_blocks == 0 and not engine.engine.has_unfinished_requests()


@pytest.mark.parametrize("abort_after", [0, 1, 5])
def test_abort_ends_the_stream_with_finish_reason_abort(engine, prompt, abort_after: int) -> None:
    deltas = asyncio.run(asyncio.wait_for(consume(engine, prompt, forced(300), abort_after), 60))
    assert deltas[-1].finished and deltas[-1].finish_reason == "abort" and len(deltas[-1].token_ids) == 0
    assert len(deltas) <= abort_after + 2  # at most the step already running when the abort came
    assert engine.stats.num_aborted == 1
    assert_clean(engine)


def test_abort_on_the_final_step_or_twice_or_unknown_changes_nothing(engine, prompt) -> None:
    async def main() -> list[GenerationOutput]:
        stream = await engine.add_request(prompt, forced(3))
        deltas = [d async for d in engine.outputs(stream)]
        engine.abort(stream.request_id)  # already finished
        engine.abort(stream.request_id)  # twice
        engine.abort("no-such-request")  # unknown
        return deltas + [d async for d in engine.generate(prompt, forced(2, seed=2))]  # still serving

    deltas = asyncio.run(asyncio.wait_for(main(), 60))
    assert [d.finish_reason for d in deltas if d.finished] == ["length", "length"]
    assert engine.stats.num_aborted == 0
    assert_clean(engine)


def test_a_step_that_raises_fails_its_requests_and_the_loop_serves_on(engine, prompt, monkeypatch) -> None:
    real_step, calls = engine.engine.step_deltas, []

    def step_failing_once() -> StepDeltas:
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected fault")
        return real_step()

    monkeypatch.setattr(engine.engine, "step_deltas", step_failing_once)

    async def main() -> list:
        first = await asyncio.gather(consume(engine, prompt, forced(20), None),
                                     consume(engine, prompt, forced(20, seed=3), None), return_exceptions=True)
        return first + [await consume(engine, prompt, forced(4), None)]

    results = asyncio.run(asyncio.wait_for(main(), 60))
    assert all(isinstance(r, RuntimeError) and "injected fault" in str(r) for r in results[:2])
    assert len(results[2]) == 4 and results[2][-1].finish_reason == "length"  # the loop lives on
    assert engine.is_running and engine.error is None and not engine.failing
    assert_clean(engine)
