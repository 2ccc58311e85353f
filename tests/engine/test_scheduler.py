"""Scheduler with fake model runners: continuous batching, chunked prefill, finish rules, preemption."""
from __future__ import annotations

import pytest
import torch
from fakes import (
    KVFakeRunner,
    ScriptedRunner,
    make_prompt,
    make_scheduler,
    make_seqs,
    run,
    snapshot,
)

from chattts_velocity.engine.sched.sequence import Sequence, SequenceStatus
from chattts_velocity.schema import SamplingParams

EOS = 625


def _step(sched, runner):
    batch = sched.schedule()
    return batch, sched.postprocess(batch, runner.step(batch))


def test_new_requests_join_between_steps():
    sched, runner = make_scheduler(), ScriptedRunner()
    first = make_seqs(2, max_new_token=20)
    for seq in first:
        sched.add(seq)
    batch, _ = _step(sched, runner)
    assert batch.seqs == first and batch.is_prefill == [True, True]
    late = Sequence("late", make_prompt(6, seed=9), SamplingParams(max_new_token=20), arrival=5.0)
    sched.add(late)
    batch, _ = _step(sched, runner)
    assert batch.seqs == [*first, late]
    assert batch.num_new_tokens == [1, 1, 6] and batch.is_prefill == [False, False, True]
    assert batch.sample == [True, True, True]


def test_chunked_prefill_respects_the_token_budget():
    sched, runner = make_scheduler(max_num_batched_tokens=4), ScriptedRunner()
    seq = make_seqs(1, prompt_len=10, max_new_token=3)[0]
    sched.add(seq)
    chunks = []
    for _ in range(3):
        batch, _ = _step(sched, runner)
        chunks.append((batch.num_computed_tokens[0], batch.num_new_tokens[0], batch.sample[0]))
        assert batch.num_tokens <= 4
    assert chunks == [(0, 4, False), (4, 4, False), (8, 2, True)]
    assert seq.num_generated == 1 and seq.num_computed_tokens == 10


def test_decodes_go_first_and_prefill_gets_the_rest_of_the_budget():
    sched, runner = make_scheduler(max_num_batched_tokens=5), ScriptedRunner()
    old = make_seqs(2, prompt_len=2, max_new_token=50)
    for seq in old:
        sched.add(seq)
    _step(sched, runner)
    long = Sequence("long", make_prompt(12, seed=7), SamplingParams(max_new_token=5), arrival=9.0)
    sched.add(long)
    sizes = []
    while long.num_generated == 0:
        batch, _ = _step(sched, runner)
        assert batch.seqs[:2] == old and batch.num_new_tokens[:2] == [1, 1]
        sizes.append(batch.num_new_tokens[2])
        assert batch.num_tokens <= 5
    assert sizes == [3, 3, 3, 3]


def test_decodes_go_before_an_older_sequence_still_prefilling():
    sched, runner = make_scheduler(max_num_batched_tokens=5), ScriptedRunner()
    young = Sequence("young", make_prompt(2), SamplingParams(max_new_token=50), arrival=1.0)
    sched.add(young)
    _step(sched, runner)
    old = Sequence("old", make_prompt(20, seed=3), SamplingParams(max_new_token=5), arrival=0.0)
    sched.add(old)
    while old.num_generated == 0:
        batch, _ = _step(sched, runner)
        assert batch.seqs[0] is young and batch.num_new_tokens[0] == 1
    assert young.num_generated == 6


def test_preempted_sequence_goes_to_the_front_of_the_queue():
    sched, runner = make_scheduler(num_blocks=7), ScriptedRunner()
    seqs = make_seqs(3, prompt_len=8, max_new_token=20)
    for seq in seqs:
        sched.add(seq)
    while not seqs[1].num_preemptions:
        _step(sched, runner)
    assert sched.waiting == [seqs[1], seqs[2]] and sched.running == [seqs[0]]
    assert seqs[1].num_computed_tokens == 0 and seqs[1].block_table == [] and seqs[1].num_generated > 0


def test_max_num_seqs_caps_the_running_set():
    sched, runner = make_scheduler(max_num_seqs=2), ScriptedRunner()
    for seq in make_seqs(5, max_new_token=3):
        sched.add(seq)
    seen = []
    done = run(sched, runner, on_step=lambda i, s, b: seen.append((b.num_seqs, len(s.running))))
    assert len(done) == 5 and max(n for n, _ in seen) == 2 and max(r for _, r in seen) == 2


def test_eos_in_any_row_finishes_and_the_eos_step_is_dropped():
    script = {"req-0": [(1, 1, 1, 1), (2, 2, 2, 2), (3, 3, 3, 3), (4, 4, EOS, 4)]}
    sched, runner = make_scheduler(), ScriptedRunner(script)
    for seq in make_seqs(2, max_new_token=6):
        sched.add(seq)
    done = run(sched, runner)
    eos, other = snapshot(done["req-0"]), snapshot(done["req-1"])
    assert eos.finish_reason == "eos" and eos.token_ids.tolist() == [[k] * 4 for k in (1, 2, 3)]
    assert eos.hidden[:, 0].tolist() == [0, 1, 2]  # hidden k predicted token k
    assert other.finish_reason == "length" and other.token_ids.shape == (6, 4)
    assert other.hidden[:, 0].tolist() == list(range(6)) and other.hidden[:, 1].eq(1).all()


def test_text_mode_eos_is_the_single_row():
    script = {"req-0": [(5,), (6,), (21136,)]}
    sched, runner = make_scheduler(), ScriptedRunner(script)
    sched.add(make_seqs(1, mode="text", eos_token_id=21136, max_new_token=9)[0])
    out = snapshot(run(sched, runner)["req-0"])
    assert out.finish_reason == "eos" and out.token_ids.tolist() == [[5], [6]]


def test_min_new_token_holds_eos_back_then_eos_finishes():
    sched, runner = make_scheduler(), KVFakeRunner(block_size=4, eos_bias=1e4)  # EOS wins unless masked
    for seq in make_seqs(2, max_new_token=20, min_new_token=5, seed=3):
        sched.add(seq)
    done = run(sched, runner)
    for seq in done.values():
        assert seq.finish_reason == "eos" and seq.num_generated == 5
        assert not (seq.token_ids() == EOS).any()


def test_max_new_token_finishes_with_length():
    sched, runner = make_scheduler(), ScriptedRunner()
    sched.add(make_seqs(1, max_new_token=7)[0])
    seq = run(sched, runner)["req-0"]
    assert seq.finish_reason == "length" and seq.num_generated == 7


def test_abort_waiting_and_running_frees_every_block():
    sched, runner = make_scheduler(num_blocks=12, max_num_seqs=1), ScriptedRunner()
    first, second = make_seqs(2, prompt_len=8, max_new_token=20)
    sched.add(first)
    sched.add(second)
    _step(sched, runner)
    assert first.status is SequenceStatus.RUNNING and second.status is SequenceStatus.WAITING
    assert sched.abort("req-1") and second.finish_reason == "abort"
    batch = sched.schedule()
    assert sched.abort("req-0")  # while its step is in flight
    assert sched.postprocess(batch, runner.step(batch)) == []
    assert first.num_generated == 1 and first.finish_reason == "abort"
    assert not sched.abort("req-0") and not sched.abort("nope")
    assert not sched.has_unfinished() and sched.block_manager.num_used_blocks == 0


@pytest.mark.parametrize("caching", [True, False])
def test_no_blocks_in_use_after_everything_finishes(caching):
    sched = make_scheduler(num_blocks=40, enable_prefix_caching=caching)
    for seq in make_seqs(6, prompt_len=9, max_new_token=12, same_prompt=True):
        sched.add(seq)
    done = run(sched, KVFakeRunner(block_size=4))
    assert len(done) == 6 and sched.block_manager.num_used_blocks == 0


def _outputs(done: dict[str, Sequence]) -> dict[str, tuple]:
    """(finish reason, tokens, hidden) per request; hidden is None for one that ended at its first step."""
    return {rid: (s.finish_reason, s.token_ids().tolist(), None if (h := s.hidden_states()) is None else h.tolist())
            for rid, s in done.items()}


def _requests() -> list[Sequence]:
    seqs = make_seqs(6, prompt_len=7, max_new_token=30, seed=11)
    seqs += make_seqs(2, prompt_len=7, max_new_token=30, same_prompt=True, seed=12)  # prefix hits
    seqs += make_seqs(2, prompt_len=5, max_new_token=25, mode="text", eos_token_id=299, seed=13)
    for i, seq in enumerate(seqs[6:]):
        seq.request_id, seq.arrival = f"late-{i}", 6.0 + i
    return seqs


@pytest.mark.parametrize("caching", [True, False])
def test_preempted_sequences_are_recomputed_with_identical_results(caching):
    reference = make_scheduler(num_blocks=200, enable_prefix_caching=caching)
    for seq in _requests():
        reference.add(seq)
    expected = _outputs(run(reference, KVFakeRunner(block_size=4)))

    small = make_scheduler(num_blocks=14, enable_prefix_caching=caching, max_num_batched_tokens=16)
    events = []

    def watch(step, sched, batch):
        for seq in sched.waiting:
            if seq.num_generated and seq.num_preemptions:
                events.append((seq.num_computed_tokens, seq.block_table, seq.num_generated))

    for seq in _requests():
        small.add(seq)
    done = run(small, KVFakeRunner(block_size=4), on_step=watch)
    assert sum(s.num_preemptions for s in done.values()) == small.num_preemptions > 0 and events
    assert all(computed == 0 and table == [] for computed, table, _ in events)
    assert _outputs(done) == expected
    assert small.block_manager.num_used_blocks == 0


def test_prefix_caching_does_not_change_results_and_ignores_other_speakers():
    spk = torch.randn(8)

    def requests() -> list[Sequence]:
        prompts = [make_prompt(11, spk=spk), make_prompt(11, spk=spk), make_prompt(11, spk=spk * 2)]
        params = SamplingParams(seed=5, max_new_token=6)
        return [Sequence(f"r{i}", p, params, float(i)) for i, p in enumerate(prompts)]

    outs = {}
    for caching in (True, False):
        sched, seqs, runner = make_scheduler(enable_prefix_caching=caching), requests(), KVFakeRunner(4)
        sched.add(seqs[0])
        done = run(sched, runner)
        for seq in seqs[1:]:
            sched.add(seq)
        outs[caching] = _outputs({**done, **run(sched, runner)})
        if caching:
            assert [s.num_cached_tokens for s in seqs] == [0, 8, 0]
    assert outs[True] == outs[False]
    assert outs[True]["r1"][1] == outs[True]["r0"][1]  # same speaker, prompt and seed


@pytest.mark.parametrize("scheduling,expected", [
    ("fcfs", ["req-0", "req-1", "req-2", "req-3"]),
    ("priority", ["req-2", "req-0", "req-3", "req-1"]),
])
def test_admission_order(scheduling, expected):
    sched = make_scheduler(max_num_seqs=1, scheduling=scheduling)
    for seq, priority in zip(make_seqs(4, max_new_token=2), [1, 2, 0, 1], strict=True):
        seq.params.priority = priority
        sched.add(seq)
    order = []
    run(sched, ScriptedRunner(), on_step=lambda i, s, b: order.extend(
        x.request_id for x in b.seqs if x.request_id not in order))
    assert order == expected


def test_priority_mode_preempts_the_lowest_priority():
    sched = make_scheduler(num_blocks=6, scheduling="priority", max_num_batched_tokens=64)
    seqs = make_seqs(2, prompt_len=7, max_new_token=14)
    seqs[0].params.priority = 5  # arrived first, but least important
    for seq in seqs:
        sched.add(seq)
    run(sched, ScriptedRunner())
    assert seqs[0].num_preemptions > 0 and seqs[1].num_preemptions == 0


def test_requests_that_can_never_fit_are_rejected_at_add():
    sched = make_scheduler(num_blocks=4, max_model_len=64)
    with pytest.raises(ValueError, match="max_model_len"):
        sched.add(make_seqs(1, prompt_len=10, max_new_token=60)[0])
    with pytest.raises(ValueError, match="KV blocks"):
        sched.add(make_seqs(1, prompt_len=10, max_new_token=7)[0])  # 17 positions > 4 blocks of 4
    sched.add(make_seqs(1, prompt_len=10, max_new_token=6)[0])
    with pytest.raises(ValueError, match="request_id"):
        sched.add(make_seqs(1, prompt_len=10, max_new_token=6)[0])


def test_unseeded_requests_get_reproducible_seeds_from_the_engine_seed():
    def seeds(engine_seed: int) -> list[int]:
        sched = make_scheduler(seed=engine_seed)
        seqs = make_seqs(3, max_new_token=5)
        seqs[1].seed = 42  # an explicit seed is kept
        for seq in seqs:
            sched.add(seq)
        return [seq.seed for seq in seqs]

    assert seeds(0) == seeds(0) and seeds(0)[1] == 42
    assert seeds(0)[0] != seeds(1)[0] and seeds(0)[0] != seeds(0)[2]
