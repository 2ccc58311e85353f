"""A job on the server's engine runner (serve/engine_runner.py): its verbs give the audio of open()'s one track, a
script's turns sound in order with their pauses, the refine pass's texts are the job's once it ends, cancel()
aborts what is generating, and the local verbs say they are the local runner's (tiny random weights)."""
from __future__ import annotations

import asyncio
import dataclasses
import time

import numpy as np
import pytest

from chattts_velocity import Chat, InferCodeParams, RefineTextParams
from chattts_velocity.engine.async_engine import AsyncLLMEngine
from chattts_velocity.serve.service import SpeechService

TEXTS = ["First text is here. It has two sentences.", "Second text."]


@pytest.fixture(scope="module")
def service(tiny_assets):
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True)
    engine = AsyncLLMEngine(chat.pipeline.stages.engine())
    service = SpeechService(chat.pipeline, engine)
    yield service
    engine.shutdown()
    service.shutdown()


def params(steps: int = 10) -> InferCodeParams:
    return InferCodeParams(manual_seed=7, max_new_token=steps, min_new_token=steps, show_tqdm=False)


async def collect(stream) -> list[np.ndarray]:
    return [chunk async for chunk in stream]


def idle(engine: AsyncLLMEngine) -> bool:
    return not engine.engine.has_unfinished_requests() and engine.engine.block_manager.num_used_blocks == 0


def test_arun_and_astream_are_opens_track_split_per_text(service) -> None:
    async def scenario() -> tuple[list[np.ndarray], list[list[np.ndarray]], np.ndarray]:
        whole = await service.synthesis(service.job(TEXTS, params())).arun()
        chunks = [c async for c in service.synthesis(service.job(TEXTS, params())).astream()]
        track = [c async for c in await service.synthesis(service.job(TEXTS, params())).open()]
        return whole, chunks, np.concatenate(track)

    whole, chunks, track = asyncio.run(scenario())
    assert len(whole) == 2 and all(len(w) for w in whole)
    assert all(sum(1 for c in yielded if len(c)) == 1 for yielded in chunks)  # each chunk in its text's place
    per_text = [np.concatenate([c[i] for c in chunks]) for i in range(2)]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(whole, per_text, strict=True))
    assert np.concatenate(whole).tobytes() == track.tobytes()  # the texts one after another


def test_a_scripts_pauses_sound_between_its_turns_in_the_track(service) -> None:
    from chattts_velocity.text.script import parse_script

    script = parse_script("One turn here. [pause: 500ms] Another turn.", 24000, "input")
    assert script is not None and len(script.turns) == 2

    async def scenario() -> tuple[np.ndarray, list[np.ndarray]]:
        stream = await service.open("", [params(), params()], script=script)
        track = np.concatenate([c async for c in stream])
        plain = await service.synthesis(service.job(script.texts, [params(), params()])).arun()
        return track, plain

    track, plain = asyncio.run(scenario())
    pause = script.turns[1].pause_before
    assert pause == 12000
    expected = np.concatenate([plain[0], np.zeros(pause, np.float32), plain[1]])
    assert track.tobytes() == expected.tobytes()


def test_the_refine_pass_texts_are_the_jobs_once_it_ends_and_refine_only_gives_them(service) -> None:
    refine = RefineTextParams(max_new_token=4, min_new_token=4, manual_seed=3, show_tqdm=False)

    async def scenario() -> tuple[list[str] | None, list[str] | None, object]:
        synthesis = service.synthesis(service.job(TEXTS[:1], params(), refine=refine))
        before = synthesis.refined
        stream = await synthesis.open()
        stream.close()
        only = dataclasses.replace(service.job(TEXTS[:1], params(), refine=refine), refine_only=True)
        return before, synthesis.refined, await service.synthesis(only).arun()

    before, after, refined_only = asyncio.run(scenario())
    assert before is None and after is not None and len(after) == 1
    assert refined_only == after  # the same seeded refine pass


def test_cancel_aborts_the_pieces_generating_and_the_local_verbs_refuse(service) -> None:
    engine = service.engine

    async def scenario() -> int:
        synthesis = service.synthesis(service.job(TEXTS, params(steps=400)))
        before = engine.stats.num_aborted
        stream = await synthesis.open()
        synthesis.cancel()
        deadline = time.monotonic() + 60  # a hang deadline only
        while not idle(engine):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        await asyncio.wait_for(collect(stream), 60)  # ends with what it had (a hang deadline only)
        return engine.stats.num_aborted - before

    assert asyncio.run(scenario()) >= 1
    synthesis = service.synthesis(service.job(TEXTS, params()))
    with pytest.raises(RuntimeError, match="^run: the engine runner"):
        synthesis.run()
    with pytest.raises(RuntimeError, match="^stream: the engine runner"):
        synthesis.stream()
