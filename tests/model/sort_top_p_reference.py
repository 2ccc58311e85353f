"""The device sampler's top-p + top-k as it ran before its sort-free kernel: a stable sort, torch's softmax of the
sorted rows, one kernel for both masks (cumulative sums in fp64). Kept for tests/model/test_top_p_top_k.py, which
checks that the sort-free kernel drops the same columns and the draw gives the same tokens."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from chattts_velocity.model.kernels.triton.sampling import EAGER, MIN_KEEP


@triton.jit
def _top_p_top_k_kernel(logits_ptr, ascending_ptr, order_ptr, probs_ptr, top_p_ptr, top_k_ptr, logits_stride,
                        vocab, MIN_KEEP: tl.constexpr, BLOCK: tl.constexpr):
    # one program per row over its stable ascending sort (values, their columns, their softmax): top-p drops the
    # columns whose cumulative probability (summed in fp64, as torch's CPU cumsum) is <= 1 - top_p but the MIN_KEEP
    # last; top-k then drops what lies below the survivor at column V - k. Two identical scans: the first finds
    # that survivor, the second writes -inf into the logits at the dropped columns.
    row = tl.program_id(0).to(tl.int64)
    top_p = tl.load(top_p_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    threshold = tl.where(top_p < 1.0, 1.0 - top_p, -1.0)  # top_p >= 1: no cumulative sum is <= -1
    # top_k <= 0: no column is the k-th, which stays -inf and drops nothing
    kth_col = tl.where(top_k > 0, vocab - tl.minimum(tl.maximum(top_k, MIN_KEEP), vocab), -1)
    kth = tl.full([], float("-inf"), tl.float32)
    for scan in tl.static_range(2):
        carry = tl.zeros([1], dtype=tl.float64)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            ok = cols < vocab
            p = tl.load(probs_ptr + row * vocab + cols, mask=ok, other=0.0).to(tl.float64)
            cumulative = tl.cumsum(p, 0)
            below = (carry + cumulative).to(tl.float32) <= threshold
            carry += tl.sum(p, 0)
            drop = below & (cols < vocab - MIN_KEEP)
            x = tl.load(ascending_ptr + row * vocab + cols, mask=ok, other=0.0)
            if scan == 0:
                hit = ok & (cols == kth_col)
                kth = tl.maximum(kth, tl.max(tl.where(hit & ~drop, x, float("-inf")), 0))  # one tile hits
            else:
                drop = drop | (x < kth)
                column = tl.load(order_ptr + row * vocab + cols, mask=ok, other=0)
                tl.store(logits_ptr + row * logits_stride + column, float("-inf"), mask=ok & drop)


def sorted_top_p_top_k(
    logits: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor, min_keep: int = MIN_KEEP
) -> torch.Tensor:
    """HF top-p then HF top-k over one stable ascending sort of logits [R, V] (modified in place and returned).

    top_p [R] float (>= 1 = off), top_k [R] int (<= 0 = off). Top-p drops a prefix of the ascending order, so
    after it the sorted row is still sorted, and the k-th largest survivor is at column V - k: one sort, no
    host sync (logits_processors.apply_top_k reads max(k) on the host). Three launches: the sort, the softmax of
    the sorted rows (torch's, so the cumulative sums are the CPU chain's) and one kernel for both masks.
    """
    rows, vocab = logits.shape
    if top_p.shape != (rows,) or top_k.shape != (rows,):
        raise ValueError(f"apply_top_p_top_k: top_p and top_k must be [{rows}], got "
                         f"{tuple(top_p.shape)} and {tuple(top_k.shape)}")
    ascending, order = torch.sort(logits, dim=-1, stable=True)
    probs = ascending.softmax(dim=-1)
    _top_p_top_k_kernel[(rows,)](logits, ascending, order, probs, top_p.float().contiguous(),
                                 top_k.long().contiguous(), logits.stride(0), vocab, MIN_KEEP=min_keep,
                                 BLOCK=min(2048, triton.next_power_of_2(vocab)), num_warps=4, **EAGER)
    return logits
