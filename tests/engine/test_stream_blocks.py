"""LLM.stream takes steady blocks whole: its rows per request equal LLM.generate's, and a steady step costs no
GenerationOutput per request; the rows reach the caller every chunk_steps steps, at ends and at due row counts."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from fakes import text_prompt, varied_params

from chattts_velocity.assets import AssetPaths
from chattts_velocity.engine.llm import LLM
from chattts_velocity.engine.sched.step import SteadyRows
from chattts_velocity.schema import GenerationOutput, Prompt, SamplingParams

STEPS = 24


@pytest.fixture(scope="module")
def llm(tiny_assets) -> LLM:
    return LLM.from_assets(AssetPaths.from_root(tiny_assets))


def _batch(llm: LLM, n: int, steps: int = STEPS) -> tuple[list[Prompt], list[SamplingParams]]:
    vocab = llm.config.num_text_tokens
    return [text_prompt(i, vocab) for i in range(n)], [varied_params(i, steps) for i in range(n)]


def _streamed(llm: LLM, prompts: list[Prompt], params: list[SamplingParams], chunk_steps: int,
              **kw: object) -> tuple[list[GenerationOutput], list[list[tuple[int, GenerationOutput]]]]:
    """Every prompt's streamed rows joined into one output (its last delta's end), and the yields."""
    yields = list(llm.stream(prompts, params, chunk_steps, **kw))  # type: ignore[arg-type]
    joined = []
    for k in range(len(prompts)):
        deltas = [d for y in yields for j, d in y if j == k]
        assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
        hidden = None if deltas[0].hidden is None else torch.cat([d.hidden for d in deltas])  # type: ignore[misc]
        joined.append(GenerationOutput(deltas[-1].request_id, torch.cat([d.token_ids for d in deltas]), hidden, True,
                                       deltas[-1].finish_reason, error=deltas[-1].error))
    for y in yields:
        assert len({k for k, _ in y}) == len(y)  # at most one delta per prompt per yield
    assert not llm.engine.has_unfinished_requests() and llm.engine.block_manager.num_used_blocks == 0
    return joined, yields


def _assert_same(got: list[GenerationOutput], want: list[GenerationOutput]) -> None:
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a.token_ids, b.token_ids) and a.finish_reason == b.finish_reason
        assert (a.hidden is None) == (b.hidden is None or len(b.hidden) == 0)
        if a.hidden is not None:
            assert torch.equal(a.hidden, b.hidden)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [1, 5])
def test_streamed_rows_equal_generate(llm: LLM, n: int) -> None:
    prompts, params = _batch(llm, n)
    want = llm.generate(prompts, params, progress=False)
    got, yields = _streamed(llm, prompts, params, 5)
    _assert_same(got, want)
    assert all(len(d.token_ids) <= 5 for y in yields for _, d in y)
    assert len(yields) < STEPS // 2  # handed on in chunks, not every step


def test_an_eos_ending_one_request_early(llm: LLM) -> None:
    prompts, params = _batch(llm, 4)
    first = llm.generate(prompts, params, progress=False)
    eos = int(first[2].token_ids[6, 0])  # a code request 2 samples at its 7th step
    params[2] = replace(params[2], eos_token_id=eos, min_new_token=2)
    want = llm.generate(prompts, params, progress=False)
    assert want[2].finish_reason == "eos" and len(want[2].token_ids) < STEPS
    got, _ = _streamed(llm, prompts, params, 6)
    _assert_same(got, want)


def test_interrupt_hands_on_what_was_logged_then_ends(llm: LLM) -> None:
    def stop_after(calls: int):
        count = [0]

        def stop() -> bool:
            count[0] += 1
            return count[0] > calls
        return stop

    prompts, params = _batch(llm, 3)
    want = llm.generate(prompts, params, progress=False, should_stop=stop_after(11))
    got, _ = _streamed(llm, prompts, params, 8, should_stop=stop_after(11))
    _assert_same(got, want)
    assert {o.finish_reason for o in got} == {"interrupted"} and all(len(o.token_ids) == 11 for o in got)


def test_closing_the_stream_aborts_what_runs(llm: LLM) -> None:
    prompts, params = _batch(llm, 3)
    stream = llm.stream(prompts, params, 4)
    next(stream)
    next(stream)
    stream.close()
    assert not llm.engine.has_unfinished_requests() and llm.engine.block_manager.num_used_blocks == 0


def test_a_due_row_count_is_handed_on_at_once(llm: LLM) -> None:
    prompts, params = _batch(llm, 2)
    _, yields = _streamed(llm, prompts, params, 16, due_rows={7})
    totals = [0, 0]
    seen = []
    for y in yields:
        for k, d in y:
            totals[k] += len(d.token_ids)
        seen.append(tuple(totals))
    assert (7, 7) in seen  # both reached 7 rows at the same step: handed on then, not at 16


def test_a_steady_step_builds_no_output_per_request(llm: LLM, monkeypatch: pytest.MonkeyPatch) -> None:
    built = [0]
    init = GenerationOutput.__init__

    def counting(self: GenerationOutput, *args: object, **kw: object) -> None:
        built[0] += 1
        init(self, *args, **kw)  # type: ignore[arg-type]

    def refused(*_: object) -> None:
        raise AssertionError("a steady block taken apart per request")

    monkeypatch.setattr(GenerationOutput, "__init__", counting)
    monkeypatch.setattr(SteadyRows, "deltas", refused)
    monkeypatch.setattr(SteadyRows, "delta", refused)
    step_deltas, per_step = llm.engine.step_deltas, []

    def counted():  # (a steady step with no single delta, the outputs the engine built in it)
        before = built[0]
        step = step_deltas()
        per_step.append((step.steady is not None and not step.singles(), built[0] - before))
        return step

    monkeypatch.setattr(llm.engine, "step_deltas", counted)
    prompts, params = _batch(llm, 6, 40)
    handed = yields = 0
    for y in llm.stream(prompts, params, 8):
        yields, handed = yields + 1, handed + len(y)
    quiet = [n for steady, n in per_step if steady]
    assert len(quiet) >= 30 and sum(quiet) == 0
    assert built[0] - sum(n for _, n in per_step) == handed  # the stream builds what it hands on, nothing more
    assert yields <= len(per_step) // 4


def test_a_chunk_steps_below_one_is_a_value_error_naming_it(llm: LLM) -> None:
    prompts, params = _batch(llm, 1)
    with pytest.raises(ValueError, match="chunk_steps"):
        next(llm.stream(prompts, params, 0))
    assert not llm.engine.has_unfinished_requests()  # nothing was queued
