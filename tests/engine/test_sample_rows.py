"""The C++ sampler (kernels' sample_rows, what Sampler.sample runs on CPU) draws the same tokens as the torch
formulation (Sampler.sample_torch) for every seed and parameter mix, on each kernel ISA this CPU runs."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from test_sampler import CODE_V, _random_seqs, _seq

from chattts_velocity.engine.worker.sampling.sampler import Sampler
from chattts_velocity.model import kernels

UNSUPPORTED = kernels.unsupported()
pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=f"CPU kernels unsupported here: {UNSUPPORTED}")


# the ISA the runtime picks here in the default suite; the others (a cold build each) in the slow suite
@pytest.fixture(params=[pytest.param(i, marks=() if i == kernels.isa() else pytest.mark.slow) for i in kernels.ISAS])
def sample_ops(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> object:
    monkeypatch.setenv(kernels.ENV_SWITCH, request.param)
    if kernels.unsupported() is not None:
        pytest.skip(f"the {request.param} kernels cannot run here: {kernels.unsupported()}")
    ops = kernels.ops(request.param)
    monkeypatch.setattr(kernels, "active_ops", ops)
    return ops


def _logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    logits[:, ::7] = logits[:, :1]  # ties: the sort's and top-k's order among equal values
    logits[0, 5] = -0.0
    return logits


@pytest.mark.parametrize("seed", range(12))
def test_the_kernel_draws_the_torch_formulations_tokens(sample_ops: object, seed: int) -> None:
    seqs = _random_seqs(24, seed)
    logits = _logits(24 * 4, CODE_V, seed)
    sampler = Sampler()
    batch = sampler.prepare(seqs, 4)
    tokens = sampler.sample(logits, batch)
    assert torch.equal(tokens, sampler.sample_torch(logits, batch))
    assert tokens.shape == (24, 4)


@pytest.mark.parametrize("streams", [1, 3, 15])
def test_a_few_streams_on_one_thread_draw_the_same_tokens(sample_ops: object, streams: int) -> None:
    """Under 64 rows the op keeps torch's kernels (the noise's among them) on the calling thread: the same bits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the torch formulation splits its noise over the threads
    try:
        sampler = Sampler()
        for seed in range(10):
            batch = sampler.prepare(_random_seqs(streams, seed), 4)
            logits = _logits(streams * 4, CODE_V, seed)
            assert torch.equal(sampler.sample(logits, batch), sampler.sample_torch(logits, batch)), seed
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("mix", ["plain", "no_penalty", "top_p_only", "top_k_only"])
def test_every_step_left_out_still_matches(sample_ops: object, mix: str) -> None:
    sampler = Sampler()
    batch = sampler.prepare(_random_seqs(16, seed=5), 4)
    left_out = {"plain": dict(penalties=None, top_p=None, top_k=None), "no_penalty": dict(penalties=None),
                "top_p_only": dict(penalties=None, top_k=None), "top_k_only": dict(penalties=None, top_p=None)}[mix]
    batch = dataclasses.replace(batch, params=dataclasses.replace(batch.params, **left_out))
    for step in range(8):  # many seeds: the noise's
        batch.noise_seeds = [seed * 1_000_003 + step for seed in range(16)]
        logits = _logits(64, CODE_V, step)
        assert torch.equal(sampler.sample(logits, batch), sampler.sample_torch(logits, batch)), step


def test_text_rows_a_tiny_penalty_and_large_seeds_match(sample_ops: object) -> None:
    seqs = [_seq(f"t{i}", generated=20, mode="text", top_p=0.9, top_k=[None, 3][i % 2], repetition_penalty=0.001,
                 penalty_window=16, seed=2**63 - 1 - i) for i in range(5)]
    sampler = Sampler()
    batch = sampler.prepare(seqs, 1)
    logits = _logits(5, 3000, 9)
    logits[:, :8] = 50.0  # the penalised ids (0..7): alpha underflows, the clamp to the finite range decides
    tokens = sampler.sample(logits, batch)
    assert torch.equal(tokens, sampler.sample_torch(logits, batch))
    assert tokens.shape == (5, 1)


def test_the_input_logits_are_left_as_they_were(sample_ops: object) -> None:
    sampler = Sampler()
    batch = sampler.prepare(_random_seqs(4, seed=3), 4)
    logits = _logits(16, CODE_V, 3)
    before = logits.clone()
    sampler.sample(logits, batch)
    assert torch.equal(logits, before)
