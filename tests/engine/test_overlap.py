"""The host a step ahead (engine/core/overlap.py): steady steps launched before the previous step's tokens are read
give exactly what the synchronous loop gives.

The same scenario runs with EngineConfig.overlap on and off on the triton backend (Triton's interpreter): codes,
hidden states, finish reasons and the order of every step's deltas (what a stream sees) must be identical through
forced lengths, EOS stops seen one step late, min_new_token, admissions, aborts mid-run, preemption and a beam
search beside sampling requests. The blocks of a sequence that ends or is aborted while a step ahead is in flight stay
out of the pool until that step completes.
"""
from __future__ import annotations

import os

import pytest
import torch

from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.core.block_manager import BlockManager
from chattts_velocity.engine.core.llm_engine import LLMEngine
from chattts_velocity.engine.core.sequence import Sequence
from chattts_velocity.model import ChatTTSLlama, Embed, kv_cache_bytes_per_block
from chattts_velocity.model.kernels.triton import available
from chattts_velocity.schema import Prompt, SamplingParams

HIDDEN, HEADS, BLOCK, TEXT_VOCAB = 64, 2, 4, 50
CONFIG = ModelConfig(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2, num_attention_heads=HEADS,
                     num_key_value_heads=HEADS, max_position_embeddings=256, num_audio_tokens=626,
                     num_text_tokens=TEXT_VOCAB)
Trace = list[tuple[str, tuple[tuple[int, ...], ...], bool, str | None, tuple[float, ...] | None]]
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
                     EngineConfig(backend=backend, dtype="float32", block_size=BLOCK, max_model_len=56,
                                  max_num_seqs=8, kv_cache_memory=blocks * per_block, overlap=overlap))


def _prompt(i: int) -> Prompt:
    ids = (torch.arange(3 + 2 * i) * 7 + i) % TEXT_VOCAB  # text prompts of different lengths
    return Prompt(ids[:, None].repeat(1, 4), torch.ones(len(ids), dtype=torch.bool))


def _params(i: int, steps: int, **kw: object) -> SamplingParams:
    base: dict[str, object] = dict(temperature=0.7, top_p=0.7 if i % 2 else None, top_k=20 if i % 3 else None,
                                   repetition_penalty=1.05 + 0.05 * (i % 2), penalty_window=4 + 4 * (i % 3),
                                   seed=100 + i, max_new_token=steps, min_new_token=steps, return_hidden=i != 1)
    return SamplingParams(**{**base, **kw})  # type: ignore[arg-type]


def _scenario(engine: LLMEngine, steps: int, eos: int = 625, beam: bool = True) -> Trace:
    """Forced lengths, a request that may stop at EOS (after min_new_token 3), one admitted and one aborted while the
    others decode, a beam search; every delta of every step, in order."""
    for i in range(4):
        engine.add_request(f"r{i}", _prompt(i), _params(i, steps - i))
    engine.add_request("eos", _prompt(5), _params(5, steps, eos_token_id=eos, min_new_token=3))
    trace: Trace = []
    for step in range(6 * steps):
        if step == 4:
            engine.add_request("late", _prompt(6), _params(6, steps))
        if step == 9 and beam:
            engine.add_request("beam", _prompt(2), SamplingParams(mode="text", beam_width=2, max_new_token=4,
                                                                   eos_token_id=TEXT_VOCAB - 1, return_hidden=False))
        if step == 12:
            engine.abort_request("r3")
        for out in engine.step():
            hidden = None if out.hidden is None else tuple(out.hidden.flatten().tolist())
            trace.append((out.request_id, tuple(map(tuple, out.token_ids.tolist())), out.finished,
                          out.finish_reason, hidden))
        if not engine.has_unfinished_requests():
            break
    assert not engine.has_unfinished_requests() and engine.block_manager.num_used_blocks == 0
    return trace


def _eos_code(backend: str) -> int:
    """A code the "eos" request samples in row 0 at its 6th step when its EOS is never sampled: an EOS stop there."""
    free = _scenario(_engine(False, backend), 12, beam=False)
    return [tokens[0][0] for rid, tokens, *_ in free if rid == "eos" and tokens][5]


def _same_both_ways(backend: str, blocks: int = 64, ahead: bool = True) -> None:
    eos = _eos_code(backend)
    expected = _scenario(_engine(False, backend, blocks), 12, eos)
    engine = _engine(True, backend, blocks)
    got = _scenario(engine, 12, eos)
    assert any(reason == "eos" for _, _, _, reason, _ in expected)
    assert got == expected  # codes, hidden states, finish reasons, the order of the deltas: identical
    assert engine.runner.overlap is ahead
    stats = engine.stats
    if ahead:  # most steady steps ran a step ahead of the host
        assert stats.num_steady_steps > 8 and stats.num_ahead_steps >= stats.num_steady_steps // 2
    else:
        assert stats.num_ahead_steps == 0


@pytest.mark.triton
@interpreter
def test_overlapped_steps_equal_the_synchronous_loop_on_triton() -> None:
    _same_both_ways("triton")


@pytest.mark.triton
@interpreter
def test_overlapped_steps_equal_the_synchronous_loop_through_preemption() -> None:
    _same_both_ways("triton", blocks=14)  # ~6 sequences of ~30 positions in 14 blocks of 4: preemption


def test_overlap_is_a_no_op_where_steady_steps_are_not_one_graph() -> None:
    _same_both_ways("torch", ahead=False)


@pytest.mark.triton
@interpreter
def test_blocks_of_a_sequence_that_ends_while_a_step_is_in_flight_stay_held() -> None:
    engine = _engine(True)
    for i in range(3):
        engine.add_request(f"r{i}", _prompt(i), _params(i, 10))
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
