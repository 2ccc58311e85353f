"""Sampler: per-row parameters, per-request seeds independent of the batch, EOS mask, text mode."""
from __future__ import annotations

import random

import pytest
import torch
from fakes import make_prompt, recent_tokens
from transformers.generation import TopKLogitsWarper, TopPLogitsWarper

from chattts_velocity.engine.sched.sequence import Sequence
from chattts_velocity.engine.worker.sampling.sampler import Sampler, step_seed
from chattts_velocity.schema import SamplingParams

CODE_V, TEXT_V, EOS, TEXT_EOS = 626, 21178, 625, 21136


def _seq(name: str, generated: int = 0, mode: str = "code", **params) -> Sequence:
    params.setdefault("seed", abs(hash(name)) % 1000)
    seq = Sequence(name, make_prompt(4), SamplingParams(mode=mode, **params))
    rng = random.Random(name)
    for _ in range(generated):
        seq.append_token(tuple(rng.randrange(8) for _ in range(seq.num_rows)), None)  # repeats: penalty bites
    return seq


def _random_seqs(n: int, seed: int = 0) -> list[Sequence]:
    rng = random.Random(seed)
    seqs = []
    for i in range(n):
        seqs.append(_seq(
            f"s{i}", generated=rng.randrange(0, 30),
            temperature=rng.choice([0.3, 1.0, (0.2, 0.5, 1.0, 2.0)]),
            top_p=rng.choice([None, 0.5, 0.7, 1.0]), top_k=rng.choice([None, 1, 5, 20]),
            repetition_penalty=rng.choice([1.0, 1.05, 1.5]), penalty_window=rng.choice([4, 16]),
            min_new_token=rng.choice([0, 10]), seed=rng.randrange(10**6),
        ))
    return seqs


def _reference(logits: torch.Tensor, seq: Sequence) -> list[int]:
    """One request alone, row by row: the spec's order with HF warpers and torch.multinomial."""
    p, rows = seq.params, []
    history = recent_tokens(seq, p.penalty_window)  # [rows, <=W]
    for q, temperature in enumerate(p.temperatures(seq.num_rows)):
        scores = logits[q].clone() / temperature
        counts = torch.zeros_like(scores)
        for t in history[q].tolist():
            counts[t] += 1
        alpha = torch.pow(torch.tensor(p.repetition_penalty), counts)
        scores = torch.where(scores < 0, scores * alpha, scores / alpha)[None]
        if p.top_p is not None and p.top_p < 1:
            scores = TopPLogitsWarper(p.top_p, min_tokens_to_keep=3)(None, scores)
        if p.top_k is not None:
            scores = TopKLogitsWarper(p.top_k, min_tokens_to_keep=3)(None, scores)
        if seq.num_generated < p.min_new_token:
            scores[0, p.eos_token_id] = float("-inf")
        rows.append(scores[0])
    generator = torch.Generator().manual_seed(step_seed(seq.seed, seq.num_generated))
    return torch.multinomial(torch.stack(rows).softmax(-1), 1, generator=generator)[:, 0].tolist()


def _sample(seqs: list[Sequence], logits: torch.Tensor, rows: int = 4) -> list[list[int]]:
    sampler = Sampler()
    return sampler.sample(logits, sampler.prepare(seqs, rows)).tolist()


@pytest.mark.parametrize("seed", range(3))
def test_batched_sampling_equals_each_request_alone_by_reference(seed):
    seqs = _random_seqs(16, seed)
    logits = torch.randn(16 * 4, CODE_V, generator=torch.Generator().manual_seed(seed)) * 3
    tokens = _sample(seqs, logits)
    for s, seq in enumerate(seqs):
        assert tokens[s] == _reference(logits[4 * s:4 * s + 4], seq), seq.request_id


def test_same_seed_same_tokens_alone_in_a_batch_and_reordered():
    seqs = _random_seqs(16, seed=7)
    logits = torch.randn(16 * 4, CODE_V) * 3
    batched = _sample(seqs, logits)
    alone = [_sample([seq], logits[4 * s:4 * s + 4])[0] for s, seq in enumerate(seqs)]
    order = list(range(16))
    random.Random(3).shuffle(order)
    shuffled = _sample([seqs[s] for s in order], torch.cat([logits[4 * s:4 * s + 4] for s in order]))
    assert batched == alone
    assert [shuffled[order.index(s)] for s in range(16)] == batched


def test_per_request_params_are_not_the_first_requests():
    """Regression for upstream's seq_groups[0]: a greedy-ish first request must not narrow the second."""
    logits = torch.linspace(1, 0, CODE_V).repeat(8, 1)  # nearly flat: the warpers decide what is possible
    distinct = set()
    for seed in range(60):
        narrow = _seq("narrow", temperature=0.1, top_k=1, top_p=None, seed=seed)
        wide = _seq("wide", temperature=1.0, top_k=None, top_p=None, seed=1000 + seed)
        tokens = _sample([narrow, wide], logits)
        assert tokens[1] == _sample([wide], logits[4:])[0]
        assert tokens[0] == _sample([narrow], logits[:4])[0]
        assert all(t < 3 for t in tokens[0])  # top_k 1 behaves as 3: the 3 largest logits
        distinct.update(tokens[1])
    assert len(distinct) > 50


def test_noise_changes_every_step_and_depends_only_on_seed_and_step():
    assert step_seed(5, 0) == step_seed(5, 0) and step_seed(5, 0) != step_seed(5, 1) != step_seed(6, 1)
    logits = torch.zeros(4, CODE_V)
    seq = _seq("x", top_k=None, top_p=None, repetition_penalty=1.0, seed=9)
    steps = []
    for _ in range(8):
        steps.append(_sample([seq], logits)[0])
        seq.append_token((0, 0, 0, 0), None)
    assert len({tuple(s) for s in steps}) == 8


def test_min_new_token_masks_eos_in_all_four_rows():
    logits = torch.zeros(4, CODE_V)
    logits[:, EOS] = 50.0  # EOS is certain unless masked
    for generated, expect_eos in [(0, False), (2, False), (3, True)]:
        seq = _seq("m", generated=generated, min_new_token=3)
        tokens = _sample([seq], logits)[0]
        assert tokens == [EOS] * 4 if expect_eos else EOS not in tokens


def test_text_mode_one_row_large_vocabulary_own_eos():
    seqs = [_seq(f"t{i}", generated=i, mode="text", eos_token_id=TEXT_EOS, min_new_token=2,
                 temperature=0.7, top_k=None if i % 2 else 20) for i in range(4)]
    logits = torch.randn(4, TEXT_V) * 3
    logits[:, TEXT_EOS] = 40.0
    tokens = _sample(seqs, logits, rows=1)
    assert [t[0] == TEXT_EOS for t in tokens] == [False, False, True, True]
    for s, seq in enumerate(seqs):
        assert tokens[s] == _reference(logits[s:s + 1], seq)


def test_custom_processors_see_own_rows_and_history_and_run_before_the_eos_mask():
    calls = []

    def boost_eos(history: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        calls.append((history.clone(), logits.shape))
        logits[:, EOS] += 1e4
        return logits

    plain = _seq("plain", generated=3)
    unwarped = {"min_new_token": 5, "logits_processors": (boost_eos,), "top_p": None, "top_k": None}
    early, late = _seq("early", generated=2, **unwarped), _seq("late", generated=5, **unwarped)
    logits = torch.randn(12, CODE_V)
    tokens = _sample([plain, early, late], logits)
    assert tokens[0] == _sample([plain], logits[:4])[0]
    assert EOS not in tokens[1] and tokens[2] == [EOS] * 4
    assert [c[1] for c in calls] == [(4, CODE_V)] * 2
    assert torch.equal(calls[0][0], early.token_ids()) and calls[1][0].shape == (5, 4)


def test_input_logits_are_not_modified_and_any_float_dtype_works():
    seq = _seq("d")
    logits = torch.randn(4, CODE_V).to(torch.bfloat16)
    before = logits.clone()
    tokens = Sampler().sample(logits, Sampler().prepare([seq], 4))
    assert tokens.shape == (1, 4) and tokens.dtype == torch.int64 and torch.equal(logits, before)


def test_prepare_rejects_mixed_modes_and_missing_seeds():
    with pytest.raises(ValueError, match="rows"):
        Sampler().prepare([_seq("a"), _seq("b", mode="text", eos_token_id=TEXT_EOS)], 4)
    unseeded = _seq("u")
    unseeded.seed = None
    with pytest.raises(ValueError, match="seed"):
        Sampler().prepare([unseeded], 4)
