"""DeviceSampler (worker/sampling/device_sampler.py): the triton backend's sampler against the CPU Sampler's chain.

On CPU the ops run in Triton's interpreter (TRITON_INTERPRET=1, set by tests/conftest.py); with CUDA the same tests
run on the GPU, and the `gpu` ones add the no-host-sync check.
"""
from __future__ import annotations

import os
import random

import pytest
import torch
from fakes import make_prompt

from chattts_velocity.engine.sched.sequence import Sequence
from chattts_velocity.engine.worker.sampling import logits_processors as lp
from chattts_velocity.engine.worker.sampling.device_sampler import DeviceSampler
from chattts_velocity.engine.worker.sampling.sampler import Sampler
from chattts_velocity.model.kernels.triton import available
from chattts_velocity.schema import SamplingParams

REASON = available()
pytestmark = [pytest.mark.triton, pytest.mark.skipif(REASON is not None, reason=f"Triton unavailable: {REASON}")]
DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
needs_cuda = pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA, with TRITON_INTERPRET unset")
CODE_V, EOS = 626, 625


def _seq(name: str, generated: int = 0, mode: str = "code", **params) -> Sequence:
    params.setdefault("seed", abs(hash(name)) % 1000)
    seq = Sequence(name, make_prompt(4), SamplingParams(mode=mode, **params))
    rng = random.Random(name)
    for _ in range(generated):
        # small ids repeat: the penalty bites
        seq.append_token(tuple(rng.randrange(8) for _ in range(seq.num_rows)), None)
    return seq


def _varied_seqs(n: int, seed: int, **fixed) -> list[Sequence]:
    rng = random.Random(seed)
    options = dict(temperature=rng.choice([0.3, 1.0, (0.2, 0.5, 1.0, 2.0)]), top_p=rng.choice([None, 0.5, 0.9]),
                   top_k=rng.choice([None, 1, 20]), repetition_penalty=rng.choice([1.0, 1.05, 1.5]),
                   penalty_window=rng.choice([4, 16]), min_new_token=rng.choice([0, 10]))
    return [_seq(f"s{seed}.{i}", generated=rng.randrange(0, 20), seed=rng.randrange(10**6),
                 **{**options, **fixed}) for i in range(n)]


def _logits(rows: int, vocab: int = CODE_V, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=gen) * 3).to(DEVICE)


def _boost_seven(history: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    logits[:, 7] += 2.0 + history.shape[0]
    return logits


@pytest.mark.parametrize("seed", range(3))
def test_the_device_chain_equals_the_cpu_chain(seed: int) -> None:
    seqs = _varied_seqs(6, seed)
    seqs.append(_seq("custom", generated=3, logits_processors=(_boost_seven,), min_new_token=5))
    logits = _logits(4 * len(seqs), seed=seed)
    expected = lp.process(logits.clone(), Sampler().prepare(seqs, 4).params)
    got = DeviceSampler().process(logits, Sampler().prepare(seqs, 4))
    assert torch.equal(got.isinf(), expected.isinf())  # the same tokens dropped and EOS masked
    torch.testing.assert_close(got, expected, rtol=2e-7, atol=0)


@pytest.mark.parametrize("top_k", [None, 1])
def test_near_greedy_rows_give_the_cpu_samplers_tokens(top_k: int | None) -> None:
    seqs = _varied_seqs(8, seed=5, temperature=1e-5, top_k=top_k)
    logits = _logits(4 * len(seqs), seed=9)
    expected = Sampler().sample(logits, Sampler().prepare(seqs, 4))
    got = DeviceSampler().sample(logits, DeviceSampler().prepare(seqs, 4))
    assert got.shape == (8, 4) and torch.equal(got.cpu(), expected.cpu())


def test_min_new_token_keeps_eos_out_until_it_is_reached() -> None:
    logits = torch.zeros(8, CODE_V, device=DEVICE)
    logits[:, EOS] = 50.0  # EOS is certain unless masked
    seqs = [_seq("early", generated=2, min_new_token=3), _seq("done", generated=3, min_new_token=3)]
    tokens = DeviceSampler().sample(logits, Sampler().prepare(seqs, 4)).tolist()
    assert EOS not in tokens[0] and tokens[1] == [EOS] * 4


def test_a_requests_tokens_do_not_depend_on_its_batch() -> None:
    seqs = _varied_seqs(5, seed=11)
    logits = _logits(4 * len(seqs), seed=3)
    sampler = DeviceSampler()
    batched = sampler.sample(logits, sampler.prepare(seqs, 4))
    for s, seq in enumerate(seqs):
        alone = sampler.sample(logits[4 * s:4 * s + 4], sampler.prepare([seq], 4))
        assert torch.equal(alone[0], batched[s])


def test_draws_follow_the_processed_distribution() -> None:
    # 2000 one-row requests (each its own seed) over a 6-token vocabulary: a chi-square test against
    # softmax(logits / T). The noise is a pure function of (seed, step), so the statistic is fixed, never flaky.
    vocab, n = 6, 2000
    row = torch.tensor([1.0, 0.5, 0.0, -0.5, 2.0, -3.0])
    seqs = [_seq(f"d{i}", mode="text", seed=i, temperature=0.7, top_p=None, top_k=None, repetition_penalty=1.0,
                 eos_token_id=vocab - 1) for i in range(n)]
    tokens = DeviceSampler().sample(row.repeat(n, 1).to(DEVICE), Sampler().prepare(seqs, 1)).flatten().cpu()
    expected = (row / 0.7).softmax(-1) * n
    observed = torch.bincount(tokens, minlength=vocab).float()
    chi_square = ((observed - expected) ** 2 / expected).sum().item()
    assert chi_square < 20.5  # 5 degrees of freedom, p = 0.001
    assert observed[5] > 0  # the rare token (p ~ 0.1%) is reachable


def test_input_logits_are_not_modified_and_bf16_works() -> None:
    seqs = [_seq("a"), _seq("b", generated=4)]
    logits = _logits(8).to(torch.bfloat16)
    before = logits.clone()
    tokens = DeviceSampler().sample(logits, Sampler().prepare(seqs, 4))
    assert tokens.dtype == torch.int64 and tokens.shape == (2, 4) and torch.equal(logits, before)


@pytest.mark.gpu
@needs_cuda
def test_device_sampling_never_syncs_the_host() -> None:
    seqs = _varied_seqs(16, seed=2)
    logits = _logits(64)
    sampler = DeviceSampler()
    batch = sampler.prepare(seqs, 4)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens = sampler.sample(logits, batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert tokens.device.type == "cuda"
    assert tokens.shape == (16, 4) and bool((tokens < CODE_V).all())
