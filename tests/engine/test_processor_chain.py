"""The one logits-processor chain (logits_processors.process): both GPT paths call it and get the same numbers;
upstream's penalty row limit stays on the plain path; extreme but valid parameters sample stably."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from fakes import make_prompt

from chattts_velocity.engine.plain.loop import BatchLoop
from chattts_velocity.engine.sched.sequence import Sequence
from chattts_velocity.engine.worker.sampling import logits_processors as lp
from chattts_velocity.engine.worker.sampling.sampler import Sampler
from chattts_velocity.model import kernels
from chattts_velocity.schema import MIN_TEMPERATURE, TOP_K_MAX, SamplingParams

CODE_V, TEXT_V, EOS, TEXT_EOS = 626, 2000, 625, 1999


@pytest.fixture
def chain_calls(monkeypatch) -> list[tuple[lp.RowParams, torch.Tensor]]:
    """Every lp.process call as (its params, a copy of its result); the engine's Sampler on torch's ops (the C++
    sampler where the kernels are loaded draws the same tokens: test_sample_rows.py)."""
    calls, original = [], lp.process
    monkeypatch.setattr(kernels, "active_ops", None)

    def spy(logits: torch.Tensor, params: lp.RowParams) -> torch.Tensor:
        out = original(logits, params)
        calls.append((params, out.clone()))
        return out

    monkeypatch.setattr(lp, "process", spy)
    return calls


def _boost_repeats(history: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """A custom processor: +0.25 per earlier occurrence, on the request's own rows."""
    for q in range(logits.shape[0]):
        for token in history[:, q].tolist():
            logits[q, token] += 0.25
    return logits


def _generated(num_steps: int, rows: int, seed: int) -> list[tuple[int, ...]]:
    rng = random.Random(seed)
    return [tuple(rng.randrange(12) for _ in range(rows)) for _ in range(num_steps)]


def _engine_rows(params: SamplingParams, generated, logits: torch.Tensor, batch: int = 1) -> None:
    seqs = [Sequence(f"r{b}", make_prompt(5), params) for b in range(batch)]
    for seq in seqs:
        for tokens in generated:
            seq.append_token(tokens, None)
    sampler = Sampler()
    sampler.sample(logits, sampler.prepare(seqs, seqs[0].num_rows))


def _plain_rows(params: SamplingParams, generated, logits: torch.Tensor, batch: int = 1) -> None:
    prompt = make_prompt(5)
    ids = prompt.input_ids.unsqueeze(0).repeat(batch, 1, 1)  # [B, P, 4]
    gpt = SimpleNamespace(config=SimpleNamespace(num_vq=4))  # BatchLoop._process needs no model
    loop = BatchLoop(gpt, params, ids, torch.ones(ids.shape[:2], dtype=torch.bool))
    for tokens in generated:  # what step() writes: the sampled rows, text ids repeated over the 4 channels
        loop.ids[:, loop.progress] = torch.tensor(tokens).expand(4) if loop.text_mode else torch.tensor(tokens)
        loop.progress += 1
    loop._process(logits.clone(), step=len(generated))


CASES = {
    "code": (dict(temperature=(0.3, 0.7, 1.0, 1.5), top_p=0.8, top_k=30, repetition_penalty=1.3, penalty_window=4,
                  min_new_token=9, seed=1, logits_processors=(_boost_repeats,)), 4, CODE_V),
    "code_no_warpers": (dict(temperature=0.5, top_p=None, top_k=None, repetition_penalty=1.0, seed=2), 4, CODE_V),
    "text": (dict(mode="text", eos_token_id=TEXT_EOS, temperature=0.7, top_p=0.7, top_k=20,
                  repetition_penalty=1.2, min_new_token=3, seed=3), 1, TEXT_V),
}


@pytest.mark.parametrize("case", CASES)
def test_engine_and_plain_path_run_the_one_chain_to_the_same_logits(chain_calls, case) -> None:
    kwargs, rows, vocab = CASES[case]
    params = SamplingParams(**kwargs)
    generated = _generated(6, rows, seed=len(case))
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(4)) * 3
    _engine_rows(params, generated, logits)
    _plain_rows(params, generated, logits)
    assert len(chain_calls) == 2  # one call per path, both through lp.process
    (engine_params, engine_out), (plain_params, plain_out) = chain_calls
    assert engine_params.rows_per_seq == plain_params.rows_per_seq == rows
    assert torch.equal(engine_out, plain_out)
    masked = len(generated) < params.min_new_token
    assert engine_params.mask_eos.tolist() == plain_params.mask_eos.tolist() == [masked] * rows


def test_upstream_penalty_row_limit_is_the_plain_paths_only(chain_calls) -> None:
    batch = 160  # 640 rows: the reference leaves rows 625.. unpenalised
    params = SamplingParams(repetition_penalty=1.5, seed=5)
    generated = _generated(3, 4, seed=6)
    logits = torch.randn(batch * 4, CODE_V, generator=torch.Generator().manual_seed(7))
    _engine_rows(params, generated, logits, batch)
    _plain_rows(params, generated, logits, batch)
    engine, plain = (call[0].penalties for call in chain_calls)
    assert torch.equal(engine, torch.full((batch * 4,), 1.5))
    assert torch.equal(plain[:CODE_V - 1], engine[:CODE_V - 1]) and bool((plain[CODE_V - 1:] == 1).all())
    assert torch.equal(chain_calls[0][1][:CODE_V - 1], chain_calls[1][1][:CODE_V - 1])


def test_the_smallest_temperature_samples_greedily_without_overflow() -> None:
    logits = torch.randn(8, CODE_V, generator=torch.Generator().manual_seed(8)) * 1e3
    params = lp.RowParams(rows_per_seq=4, temperatures=torch.full((8,), MIN_TEMPERATURE),
                          eos_ids=torch.full((8,), EOS), mask_eos=torch.zeros(8, dtype=torch.bool))
    scaled = lp.process(logits.clone(), params)
    assert bool(torch.isfinite(scaled).all()) and not bool(scaled.softmax(-1).isnan().any())
    greedy = dict(temperature=MIN_TEMPERATURE, top_p=None, top_k=None, repetition_penalty=1.0)
    seqs = [Sequence(f"g{s}", make_prompt(4), SamplingParams(seed=s, **greedy)) for s in range(2)]
    sampler = Sampler()
    tokens = sampler.sample(logits, sampler.prepare(seqs, 4))
    assert torch.equal(tokens.view(-1), logits.argmax(-1))


def test_top_k_above_the_vocabulary_keeps_every_token() -> None:
    logits = torch.randn(4, CODE_V, generator=torch.Generator().manual_seed(9))
    huge, off = (Sequence("k", make_prompt(4), SamplingParams(top_k=k, top_p=None, seed=11)) for k in (TOP_K_MAX, None))
    sampler = Sampler()
    tokens = [sampler.sample(logits, sampler.prepare([seq], 4)) for seq in (huge, off)]
    assert torch.equal(*tokens)


@pytest.mark.parametrize("penalty", [1e-3, 1e30])
def test_extreme_penalties_give_finite_probabilities(penalty: float) -> None:
    seq = Sequence("p", make_prompt(4), SamplingParams(repetition_penalty=penalty, top_p=None, top_k=None, seed=12))
    for _ in range(16):  # penalty ** 16 under- or overflows float32
        seq.append_token((3, 3, 3, 3), None)
    logits = torch.randn(4, CODE_V, generator=torch.Generator().manual_seed(13))
    logits[:, 3] = torch.tensor([0.0, -2.0, 2.0, 5.0])  # 0 / 0 would be NaN
    sampler = Sampler()
    batch = sampler.prepare([seq], 4)
    probs = lp.process(logits.clone(), batch.params).softmax(-1)
    assert not bool(probs.isnan().any())
    tokens = sampler.sample(logits, batch)[0].tolist()
    if penalty < 1:  # a repeated positive logit is boosted past every other token
        assert tokens[2:] == [3, 3]
    else:  # and pushed below every other one
        assert 3 not in tokens[1:]
