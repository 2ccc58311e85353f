"""The host a step ahead (engine/worker/overlap.py): steady steps launched before the previous step's tokens are read
give exactly what the synchronous loop gives.

The same scenario runs with EngineConfig.overlap on and off on the triton backend (Triton's interpreter). A steady
batch decoding to the end (forced lengths, an EOS stop seen one step late, min_new_token) gives identical deltas, bit
for bit and in order; through admissions, aborts mid-run, preemption and a beam search beside sampling requests each
request's stream is identical too (codes, hidden states, finish reasons), although its rows run in other batches and
other kinds of step (a decode row beside a prefill chunk attends with the decode kernel). The blocks of a sequence
that ends or is aborted while a step ahead is in flight stay out of the pool until that step completes.
"""
from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable

import pytest
import torch
from fakes import text_prompt, varied_params

from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.llm_engine import LLMEngine
from chattts_velocity.engine.sched.block_manager import BlockManager
from chattts_velocity.engine.sched.sequence import Sequence
from chattts_velocity.model import ChatTTSLlama, Embed, kv_cache_bytes_per_block
from chattts_velocity.model.kernels.triton import available
from chattts_velocity.schema import Prompt, SamplingParams

HIDDEN, HEADS, BLOCK, TEXT_VOCAB = 64, 2, 4, 50
CONFIG = ModelConfig(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2, num_attention_heads=HEADS,
                     num_key_value_heads=HEADS, max_position_embeddings=256, num_audio_tokens=626,
                     num_text_tokens=TEXT_VOCAB)
Trace = list[tuple[str, tuple[tuple[int, ...], ...], bool, str | None, tuple[float, ...] | None]]
Scenario = Callable[[LLMEngine, int], Trace]
interpreter = pytest.mark.skipif(available() is not None or os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs Triton's interpreter (TRITON_INTERPRET=1)")


def _engine(overlap: bool, backend: str = "triton", blocks: int = 64) -> LLMEngine:
    gen = torch.Generator().manual_seed(0)
    model, embed = ChatTTSLlama(CONFIG), Embed(HIDDEN, 626, TEXT_VOCAB, 4)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *embed.named_parameters()]:
            p.copy_(torch.rand(p.shape, generator=gen) + 0.5 if "norm" in name and p.dim() == 1
                    else torch.randn(p.shape, generator=gen) * (0.3 if "emb" in name or "head" in name else 0.08))
    per_block = kv_cache_bytes_per_block(CONFIG.num_hidden_layers, BLOCK, HEADS, CONFIG.head_dim, torch.float32)
    return LLMEngine(model.eval(), embed.eval(), CONFIG,
                     EngineConfig.from_kwargs(backend=backend, dtype="float32", block_size=BLOCK, max_model_len=56,
                                  max_num_seqs=8, kv_cache_memory=blocks * per_block, overlap=overlap))


def _prompt(i: int) -> Prompt:
    return text_prompt(i, TEXT_VOCAB)


def _run(engine: LLMEngine, events: dict[int, Callable[[LLMEngine], object]], limit: int = 80) -> Trace:
    """Every delta of every step, in order; events[k] runs before the k-th call of step()."""
    trace: Trace = []
    for step in range(limit):
        if step in events:
            events[step](engine)
        for out in engine.step():
            hidden = None if out.hidden is None else tuple(out.hidden.flatten().tolist())
            trace.append((out.request_id, tuple(map(tuple, out.token_ids.tolist())), out.finished,
                          out.finish_reason, hidden))
        if not engine.has_unfinished_requests():
            break
    assert not engine.has_unfinished_requests() and engine.block_manager.num_used_blocks == 0
    return trace


def _steady(engine: LLMEngine, eos: int) -> Trace:
    """Four sequences decoding together to the end: forced lengths, and one that stops at EOS after
    min_new_token 3 (4 rows, then 3: one graph size, so every row's arithmetic is the same both ways)."""
    for i in range(3):
        engine.add_request(f"r{i}", _prompt(i), varied_params(i, 10 - i))
    engine.add_request("eos", _prompt(5), varied_params(5, 10, eos_token_id=eos, min_new_token=3))
    return _run(engine, {})


def _mixed(engine: LLMEngine, eos: int) -> Trace:
    """_steady's kind of requests, plus one admitted and one aborted while the others decode, and a beam search."""
    for i in range(4):
        engine.add_request(f"r{i}", _prompt(i), varied_params(i, 12 - i))
    engine.add_request("eos", _prompt(5), varied_params(5, 12, eos_token_id=eos, min_new_token=3))
    beam = SamplingParams(mode="text", beam_width=2, max_new_token=4, eos_token_id=TEXT_VOCAB - 1,
                          return_hidden=False)
    return _run(engine, {4: lambda e: e.add_request("late", _prompt(6), varied_params(6, 12)),
                         9: lambda e: e.add_request("beam", _prompt(2), beam),
                         12: lambda e: e.abort_request("r3")})


def _eos_code(scenario: Scenario, backend: str, blocks: int) -> int:
    """A code the "eos" request samples in row 0 at its 6th step when its EOS is never sampled: an EOS stop there."""
    free = scenario(_engine(False, backend, blocks), 625)
    return [tokens[0][0] for rid, tokens, *_ in free if rid == "eos" and tokens][5]


def _both_ways(scenario: Scenario, backend: str = "triton", blocks: int = 64) -> tuple[Trace, Trace, LLMEngine]:
    eos = _eos_code(scenario, backend, blocks)
    expected = scenario(_engine(False, backend, blocks), eos)
    engine = _engine(True, backend, blocks)
    got = scenario(engine, eos)
    assert any(reason == "eos" for _, _, _, reason, _ in expected)
    stats = engine.stats
    assert engine.runner.overlap is (backend == "triton")
    if engine.runner.overlap:  # most steady steps ran a step ahead of the host
        assert stats.num_steady_steps > 6 and stats.num_ahead_steps >= stats.num_steady_steps // 2
    else:
        assert stats.num_ahead_steps == 0
    return got, expected, engine


def _streams(trace: Trace) -> dict[str, Trace]:
    streams: dict[str, Trace] = defaultdict(list)
    for delta in trace:
        streams[delta[0]].append(delta)
    return streams


@pytest.mark.triton
@interpreter
def test_overlapped_steps_equal_the_synchronous_loop_bit_for_bit() -> None:
    got, expected, engine = _both_ways(_steady)
    assert got == expected  # codes, hidden states, finish reasons, the order of the deltas: identical
    # the rows a step ahead computed for a sequence that had just ended are not counted as sampled
    assert engine.stats.num_tokens_sampled == sum(len(tokens) for _, tokens, *_ in got) + 1  # + the EOS row


def _same_streams(got: Trace, expected: Trace) -> None:
    """Each request's stream: identical codes, hidden states and finish reasons. A request admitted while a step is
    in flight joins a step later, and an ended row stays in its last step ahead: a row's batch-mates and the kind of
    step it runs in differ, and neither changes its bits."""
    got_streams, expected_streams = _streams(got), _streams(expected)
    assert got_streams.keys() == expected_streams.keys()
    for rid, stream in expected_streams.items():
        assert got_streams[rid] == stream, rid


@pytest.mark.triton
@interpreter
def test_overlapped_streams_equal_the_synchronous_ones_through_admissions_and_aborts() -> None:
    _same_streams(*_both_ways(_mixed)[:2])


@pytest.mark.triton
@pytest.mark.slow
@interpreter
def test_overlapped_streams_equal_the_synchronous_ones_through_preemption() -> None:
    got, expected, engine = _both_ways(_mixed, blocks=14)  # ~6 sequences of ~30 positions in 14 blocks of 4
    assert engine.scheduler.num_preemptions > 0
    _same_streams(got, expected)


def test_overlap_is_a_no_op_where_steady_steps_are_not_one_graph() -> None:
    got, expected, _ = _both_ways(_mixed, "torch")
    assert got == expected


@pytest.mark.triton
@interpreter
def test_blocks_of_a_sequence_that_ends_while_a_step_is_in_flight_stay_held() -> None:
    engine = _engine(True)
    for i in range(3):
        engine.add_request(f"r{i}", _prompt(i), varied_params(i, 10))
    while engine.in_flight is None:
        engine.step()
    pool = engine.block_manager
    victim = next(seq for seq in engine.in_flight.batch.seqs if seq.request_id == "r1")
    blocks = list(victim.block_table)
    free = pool.num_free_blocks
    assert engine.abort_request("r1")
    assert pool.num_free_blocks == free and not set(blocks) & set(pool._free)  # the step ahead may still write them
    deltas = engine.step()  # drains: reads the step in flight, then frees
    assert engine.in_flight is None and "r1" not in {d.request_id for d in deltas}
    assert pool.num_free_blocks >= free + len(blocks) and set(blocks) <= set(pool._free)


def test_held_blocks_return_to_the_pool_on_release() -> None:
    pool = BlockManager(8, 4, enable_prefix_caching=False)
    seq = Sequence("s", Prompt(torch.zeros(6, 4, dtype=torch.int64), torch.ones(6, dtype=torch.bool)),
                   SamplingParams(seed=0))
    pool.allocate(seq)
    pool.hold()
    pool.free(seq)
    assert seq.block_table == [] and pool.num_used_blocks == 2  # the sequence let go, the pool did not
    pool.release()
    assert pool.num_used_blocks == 0
