"""The persistent decode batch (engine/sched/decode_batch.py) gives exactly what the per-sequence loop gives.

The same scenario runs twice on one backend: with the steady path (the default) and with `scheduler.use_steady`
False (every step the per-sequence loop: the oracle). Codes, hidden states, finish reasons and the order of the
deltas must be identical, through forced lengths, EOS, min_new_token, admissions while others decode, aborts,
preemption and recompute, a beam-search request beside sampling ones, and sequences that keep no hidden states.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from fakes import text_prompt, varied_params

from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.llm_engine import LLMEngine
from chattts_velocity.engine.sched.decode_batch import splitmix64
from chattts_velocity.engine.worker.sampling.sampler import step_seed
from chattts_velocity.model import ChatTTSLlama, Embed, kernels, kv_cache_bytes_per_block
from chattts_velocity.model.kernels.triton import available
from chattts_velocity.schema import Prompt, SamplingParams

HIDDEN, HEADS, BLOCK, TEXT_VOCAB = 64, 2, 4, 50
CONFIG = ModelConfig(hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2, num_attention_heads=HEADS,
                     num_key_value_heads=HEADS, max_position_embeddings=256, num_audio_tokens=626,
                     num_text_tokens=TEXT_VOCAB)
Trace = list[tuple[str, tuple[tuple[int, ...], ...], bool, str | None, tuple[float, ...] | None]]


def _engine(backend: str, blocks: int = 64, steady: bool = True) -> LLMEngine:
    gen = torch.Generator().manual_seed(0)
    model, embed = ChatTTSLlama(CONFIG), Embed(HIDDEN, 626, TEXT_VOCAB, 4)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *embed.named_parameters()]:
            p.copy_(torch.rand(p.shape, generator=gen) + 0.5 if "norm" in name and p.dim() == 1
                    else torch.randn(p.shape, generator=gen) * (0.3 if "emb" in name or "head" in name else 0.08))
    dtype = "bfloat16" if backend == "cpu" else "float32"
    per_block = kv_cache_bytes_per_block(CONFIG.num_hidden_layers, BLOCK, HEADS, CONFIG.head_dim,
                                         torch.bfloat16 if backend == "cpu" else torch.float32)
    engine = LLMEngine(model.eval(), embed.eval(), CONFIG,
                       EngineConfig.from_kwargs(backend=backend, dtype=dtype, block_size=BLOCK, max_model_len=56,
                                    max_num_seqs=8, kv_cache_memory=blocks * per_block))
    assert engine.runner.backend.name == backend
    engine.scheduler.use_steady = steady
    return engine


def _prompt(i: int) -> Prompt:
    return text_prompt(i, TEXT_VOCAB)


def _scenario(engine: LLMEngine, steps: int, eos: int = 625) -> Trace:
    """Requests of forced lengths, one that may end at EOS, one admitted while the others decode, one aborted,
    one beam search; every delta of every step, in order."""
    for i in range(4):
        engine.add_request(f"r{i}", _prompt(i), varied_params(i, steps - i))
    engine.add_request("eos", _prompt(5), varied_params(5, steps, eos_token_id=eos, min_new_token=2))
    trace: Trace = []
    for step in range(4 * steps):
        if step == 3:
            engine.add_request("late", _prompt(6), varied_params(6, steps))
        if step == 5:
            engine.add_request("beam", _prompt(2), SamplingParams(mode="text", beam_width=2, max_new_token=4,
                                                                   eos_token_id=TEXT_VOCAB - 1, return_hidden=False))
        if step == 7:
            engine.abort_request("r3")
        for out in engine.step():
            hidden = None if out.hidden is None else tuple(out.hidden.flatten().tolist())
            trace.append((out.request_id, tuple(map(tuple, out.token_ids.tolist())), out.finished,
                          out.finish_reason, hidden))
        if not engine.has_unfinished_requests():
            break
    assert not engine.has_unfinished_requests() and engine.block_manager.num_used_blocks == 0
    return trace


def _same_both_ways(backend: str, steps: int, blocks: int = 64, hidden_tolerance: float = 0.0) -> None:
    oracle = _engine(backend, blocks, steady=False)
    free = _scenario(oracle, steps)
    # an EOS id the "eos" request samples: its own row-0 code at its 5th step when 625 was its EOS
    codes = [tokens[0][0] for rid, tokens, *_ in free if rid == "eos" and tokens]
    eos = codes[4]
    expected = _scenario(_engine(backend, blocks, steady=False), steps, eos)
    engine = _engine(backend, blocks)
    got = _scenario(engine, steps, eos)
    assert engine.stats.num_steady_steps > steps // 2  # the persistent batch did serve most steps
    assert any(reason == "eos" for _, _, _, reason, _ in expected)
    assert [delta[:4] for delta in got] == [delta[:4] for delta in expected]  # codes, finish, order: identical
    for (*_, hidden), (*_, reference) in zip(got, expected, strict=True):
        assert (hidden is None) == (reference is None)
        if hidden is not None and reference is not None:
            assert max(abs(a - b) for a, b in zip(hidden, reference, strict=True)) <= hidden_tolerance


@pytest.mark.skipif(kernels.unsupported() is not None, reason=f"CPU kernels: {kernels.unsupported()}")
def test_steady_decode_equals_the_per_sequence_loop_on_the_cpu_backend() -> None:
    _same_both_ways("cpu", 14)


def test_steady_decode_equals_the_per_sequence_loop_on_the_torch_backend() -> None:
    _same_both_ways("torch", 14)


def test_steady_decode_equals_the_per_sequence_loop_through_preemption() -> None:
    engine = _engine("torch", blocks=14)  # ~6 sequences of ~30 positions in 14 blocks of 4: preemption
    _scenario(engine, 14)
    assert engine.scheduler.num_preemptions > 0
    _same_both_ways("torch", 14, blocks=14)


@pytest.mark.triton
@pytest.mark.skipif(available() is not None or os.environ.get("TRITON_INTERPRET") != "1",
                    reason="needs Triton's interpreter (TRITON_INTERPRET=1)")
def test_steady_decode_equals_the_per_sequence_loop_on_triton() -> None:
    # the steady steps run as one graph on buffers padded to the ladder's size (worker/backends/step_graph.py): the
    # decode attention's split count follows the batch size, so hidden states may differ in the last bits
    _same_both_ways("triton", 8, hidden_tolerance=1e-5)


def test_vectorised_step_seeds_equal_the_per_request_ones() -> None:
    seeds = [0, 1, 2**63 - 1, 123456789]
    steps = [0, 7, 999, 2**20]
    keys = splitmix64(np.array(seeds, dtype=np.uint64))
    got = splitmix64(keys ^ np.array(steps, dtype=np.uint64)).tolist()
    assert got == [step_seed(s, k) for s, k in zip(seeds, steps, strict=True)]
