"""Each logits processor against a straightforward per-row re-implementation (and HF's warpers)."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity.engine.worker.sampling import logits_processors as lp

ROWS, VOCAB = 12, 50


def _logits(seed: int = 0) -> torch.Tensor:
    return torch.randn(ROWS, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def _penalty_row(scores: list[float], history: list[int], penalty: float) -> list[float]:
    out = []
    for v, s in enumerate(scores):
        alpha = penalty ** sum(1 for t in history if t == v)
        out.append(s * alpha if s < 0 else s / alpha)
    return out


def _top_p_row(scores: list[float], top_p: float, min_keep: int) -> list[float]:
    if top_p >= 1:
        return scores
    order = sorted(range(len(scores)), key=lambda v: scores[v])  # ascending
    probs = torch.tensor([scores[v] for v in order]).softmax(0).tolist()
    out, cumulative = list(scores), 0.0
    for rank, v in enumerate(order):
        cumulative += probs[rank]
        if cumulative <= 1 - top_p and rank < len(order) - min_keep:
            out[v] = float("-inf")
    return out


def _top_k_row(scores: list[float], top_k: int, min_keep: int) -> list[float]:
    if top_k <= 0:
        return scores
    k = min(max(top_k, min_keep), len(scores))
    kth = sorted(scores, reverse=True)[k - 1]
    return [s if s >= kth else float("-inf") for s in scores]


def test_temperature_is_per_row():
    logits, temps = _logits(), torch.rand(ROWS) + 0.1
    expected = torch.stack([logits[r] / temps[r] for r in range(ROWS)])
    assert torch.allclose(lp.apply_temperature(logits.clone(), temps), expected)


def test_repetition_penalty_matches_the_asymmetric_rule_per_row():
    gen = torch.Generator().manual_seed(1)
    logits = _logits(1)
    history = torch.randint(0, 8, (ROWS, 16), generator=gen)  # small ids: repeats are frequent
    history[:, 10:] = -1
    history[3] = -1  # a row with no history
    penalty = torch.rand(ROWS, generator=gen) + 0.8
    penalty[5] = 1.0
    out = lp.apply_repetition_penalty(logits.clone(), history, penalty)
    for r in range(ROWS):
        ids = [t for t in history[r].tolist() if t >= 0]
        expected = torch.tensor(_penalty_row(logits[r].tolist(), ids, float(penalty[r])))
        assert torch.allclose(out[r], expected, rtol=1e-5, atol=1e-6), r
    assert torch.equal(out[3], logits[3]) and torch.equal(out[5], logits[5])
    empty = torch.zeros(ROWS, 0, dtype=torch.int64)  # first step: no history yet
    assert torch.equal(lp.apply_repetition_penalty(logits.clone(), empty, penalty), logits)


@pytest.mark.parametrize("left_pad", [False, True])
def test_repetition_penalty_is_bit_identical_to_the_one_hot_formula(left_pad):
    """Upstream's repetition penalty: freq = one_hot(window).sum, alpha = penalty ** freq over the whole row."""
    gen = torch.Generator().manual_seed(2)
    logits = _logits(2)
    history = torch.randint(0, 5, (ROWS, 16), generator=gen)
    lengths = torch.randint(0, 17, (ROWS,), generator=gen)
    for r in range(ROWS):  # -1 padding on either side, as the sampler and the plain path build it
        pad = slice(0, 16 - int(lengths[r])) if left_pad else slice(int(lengths[r]), 16)
        history[r, pad] = -1
    penalty = torch.rand(ROWS, generator=gen) + 0.9
    freq = torch.stack([torch.bincount(h[h >= 0], minlength=VOCAB) for h in history])  # [R, V]
    alpha = torch.pow(penalty.unsqueeze(1), freq.to(torch.float32))
    expected = torch.where(logits < 0, logits * alpha, logits / alpha)
    assert torch.equal(lp.apply_repetition_penalty(logits.clone(), history, penalty), expected)


@pytest.mark.parametrize("shape", [(ROWS, VOCAB), (3, 21178), (2, 1)])
def test_sort_ascending_is_torchs_stable_sort_even_with_ties(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(4)).mul(4).round()  # many ties
    x[0, 0] = -0.0
    x.view(-1)[1:3] = torch.tensor([float("-inf"), 0.0])[: x.numel() - 1]
    values, index = lp.sort_ascending(x)
    expected_values, expected_index = torch.sort(x, dim=-1, stable=True)
    assert torch.equal(index, expected_index) and torch.equal(values, expected_values)


@pytest.mark.parametrize("seed", range(3))
def test_top_p_matches_a_per_row_loop_and_hf(seed):
    from transformers.generation import TopPLogitsWarper

    logits = _logits(seed)
    top_p = torch.tensor([0.05, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0, 1.0, 0.2, 0.6, 0.8, 0.95])
    out = lp.apply_top_p(logits.clone(), top_p)
    for r in range(ROWS):
        expected = torch.tensor(_top_p_row(logits[r].tolist(), float(top_p[r]), 3))
        assert torch.equal(torch.isinf(out[r]), torch.isinf(expected)), r
        if top_p[r] < 1:
            hf = TopPLogitsWarper(float(top_p[r]), min_tokens_to_keep=3)(None, logits[r:r + 1].clone())[0]
            assert torch.equal(out[r], hf), r
    assert torch.equal(out[6:8], logits[6:8])  # top_p 1.0 rows untouched
    assert (torch.isfinite(out).sum(1) >= 3).all()


@pytest.mark.parametrize("seed", range(3))
def test_top_k_matches_a_per_row_loop_and_hf(seed):
    from transformers.generation import TopKLogitsWarper

    logits = _logits(seed)
    top_k = torch.tensor([1, 2, 3, 4, 5, 10, 20, 0, 0, 49, 50, 80])
    out = lp.apply_top_k(logits.clone(), top_k)
    for r in range(ROWS):
        expected = torch.tensor(_top_k_row(logits[r].tolist(), int(top_k[r]), 3))
        assert torch.equal(out[r], expected), r
        if top_k[r] > 0:
            hf = TopKLogitsWarper(int(top_k[r]), min_tokens_to_keep=3)(None, logits[r:r + 1].clone())[0]
            assert torch.equal(out[r], hf), r
    assert torch.equal(out[7:9], logits[7:9])  # top_k None rows untouched
    assert torch.isfinite(out[:3]).sum(1).tolist() == [3, 3, 3]  # top_k < 3 keeps 3


def test_top_k_keeps_ties():
    logits = torch.tensor([[5.0, 4.0, 3.0, 3.0, 3.0, 1.0]])
    out = lp.apply_top_k(logits.clone(), torch.tensor([3]))
    assert torch.isfinite(out).tolist() == [[True, True, True, True, True, False]]


def test_mask_eos_only_on_flagged_rows_with_their_own_eos():
    logits = _logits()
    rows = torch.tensor([True, False] * (ROWS // 2))
    eos = torch.arange(ROWS) % 5 + 40
    out = lp.mask_eos(logits.clone(), rows, eos)
    for r in range(ROWS):
        expected = logits[r].clone()
        if rows[r]:
            expected[eos[r]] = float("-inf")
        assert torch.equal(out[r], expected)
