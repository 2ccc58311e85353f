"""The sort-free top-p + top-k (model/kernels/triton/top_p_top_k.py) against the sort it replaced
(sort_top_p_reference.py: a stable sort, torch's softmax of the sorted rows, one mask kernel) and the CPU chain
(logits_processors), and the draw that runs it in the same kernel against the old chain's draw, on many seeded rows.

Runs on CUDA, or in Triton's CPU interpreter (see test_triton_kernels.py).
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from chattts_velocity.engine.worker.sampling import logits_processors as lp
from chattts_velocity.engine.worker.sampling.sampler import step_seed
from chattts_velocity.model.kernels.triton import available

if available() is not None:
    pytest.skip(f"Triton kernels unavailable: {available()}", allow_module_level=True)

from sort_top_p_reference import sorted_top_p_top_k

from chattts_velocity.model.kernels.triton import prefill_attention, sampling, top_p_top_k

pytestmark = pytest.mark.triton
DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
ROWS, VOCAB = 256, 626  # 64 sequences of ChatTTS's 4 code rows


def varied_rows(rows: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [rows, vocab] at temperatures from peaked to flat, some rows of integers (ties, -0.0 and 0.0), and
    per-row top_p / top_k (off, the defaults, extremes)."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.empty(rows, 1).uniform_(-1.0, 3.0, generator=gen))  # x ~ N(0, 0.4^2) to N(0, 20^2)
    logits = torch.randn(rows, vocab, generator=gen) * scale
    ties = torch.arange(rows) % 5 == 0
    logits[ties] = torch.randint(-3, 4, (int(ties.sum()), vocab), generator=gen).float()
    logits[ties, :7] = -0.0
    top_p = torch.tensor([1.0, 0.7, 0.9, 0.5, 0.01, 0.99, 0.3])[torch.randint(0, 7, (rows,), generator=gen)]
    top_k = torch.tensor([0, 20, 1, 3, 5, 200, vocab + 5])[torch.randint(0, 7, (rows,), generator=gen)]
    return logits.to(DEVICE), top_p.to(DEVICE), top_k.to(DEVICE)


def test_search_constants_close_every_key_range(monkeypatch):
    for interpreted in (True, False):  # 16 probes a round under the interpreter, a bisection on a GPU
        monkeypatch.setattr(prefill_attention, "INTERPRETED", interpreted)
        search = top_p_top_k.search_for(VOCAB)
        assert search["PROBES"] == (16 if interpreted else 1)
        assert (search["PROBES"] + 1) ** search["ROUNDS"] > 2 ** top_p_top_k.KEY_BITS
        assert search["ONE_TILE"] and search["BLOCK"] == 1024
    assert not top_p_top_k.search_for(21178)["ONE_TILE"]  # the text rows: tiles
    with pytest.raises(ValueError, match="vocab"):
        top_p_top_k.search_for(1 << 17)


def test_masks_equal_the_sort_and_the_cpu_chain():
    logits, top_p, top_k = varied_rows(ROWS, VOCAB, seed=0)
    new = sampling.apply_top_p_top_k(logits.clone(), top_p, top_k)
    old = sorted_top_p_top_k(logits.clone(), top_p, top_k)
    cpu = lp.apply_top_k(lp.apply_top_p(logits.cpu().clone(), top_p.cpu()), top_k.cpu())
    assert torch.equal(new, old)
    assert torch.equal(new.cpu(), cpu)
    dropped = new.isinf().sum(1)
    distinct = (top_k.cpu() == 1) & (torch.arange(ROWS) % 5 != 0)  # rows without ties
    assert (dropped[distinct] == VOCAB - 3).all()  # top_k 1 keeps MIN_KEEP = 3
    assert (dropped > 0).float().mean() > 0.5 and (dropped == 0).any()


def test_masks_of_rows_wider_than_a_tile():
    logits, top_p, top_k = varied_rows(12, 2500, seed=1)  # three tiles of 1024
    new = sampling.apply_top_p_top_k(logits.clone(), top_p, top_k)
    old = sorted_top_p_top_k(logits.clone(), top_p, top_k)
    assert torch.equal(new, old)
    seeds = sampling.noise_seeds([step_seed(s, 3) for s in range(12)], DEVICE)  # a text row per sequence
    assert torch.equal(sampling.sample(logits, seeds, 1, top_p=top_p, top_k=top_k), sampling.sample(old, seeds, 1))


def test_the_fused_draw_gives_the_old_chains_tokens():
    # the old device sampler: sort-based masks, then the draw; the new one: masks and draw in one kernel
    logits, top_p, top_k = varied_rows(ROWS, VOCAB, seed=2)
    seeds = sampling.noise_seeds([step_seed(s, s % 7) for s in range(ROWS // 4)], DEVICE)
    mask_eos = (torch.arange(ROWS, device=DEVICE) % 3 == 0).long()
    eos_ids = torch.full((ROWS,), VOCAB - 1, device=DEVICE)
    old = sampling.sample(sorted_top_p_top_k(logits.clone(), top_p, top_k), seeds, 4, mask_eos, eos_ids)
    kept = logits.clone()
    new = sampling.sample(kept, seeds, 4, mask_eos, eos_ids, top_p=top_p, top_k=top_k)
    assert torch.equal(kept, logits)  # the draw does not write the logits
    assert torch.equal(new, old)
    assert len(set(new.flatten().tolist())) > ROWS // 4  # varied draws, not one token
    alone = sampling.sample(logits[8:12], seeds[2:3], 4, mask_eos[8:12], eos_ids[8:12], top_p=top_p[8:12],
                            top_k=top_k[8:12])
    assert torch.equal(alone, new[2:3])
