"""Engine stage: logits processors, pure functions over sampling rows with per-row parameters.

Every function takes logits [R, V] (one row per (sequence, codebook)) and per-row tensors [R],
and returns logits [R, V] (possibly the same tensor, modified in place).
`process` applies them in this fixed order (the reference's order, spec section 7), for both GPT
paths (the engine's Sampler and the plain path's loop):
    temperature -> repetition penalty -> top-p -> top-k -> custom processors -> min_new_token EOS mask
Custom processors run after the built-ins so they see the warped distribution, and before the
EOS mask so that min_new_token holds whatever they do.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from chattts_velocity.schema import LogitsProcessor


@dataclass
class RowParams:
    """One step's per-row parameters of the chain; row s * rows_per_seq + q is row q of sequence s.

    A step whose tensor is None is skipped. Tensors may live on any device (process moves them).
    """

    rows_per_seq: int  # num_vq in code mode, 1 in text mode
    temperatures: torch.Tensor  # [R] float32
    eos_ids: torch.Tensor  # [R] int64
    mask_eos: torch.Tensor  # [R] bool; True while the sequence is below its min_new_token
    penalties: torch.Tensor | None = None  # [R] float32, 1.0 = off; needs history
    history: torch.Tensor | None = None  # [R, W] int64 recent generated ids, -1 = padding
    top_p: torch.Tensor | None = None  # [R] float32, 1.0 = off
    top_k: torch.Tensor | None = None  # [R] int64, 0 = off
    # (sequence index, its processors, its generated history [G, rows_per_seq]) for sequences that have any
    custom: list[tuple[int, tuple[LogitsProcessor, ...], torch.Tensor]] = field(default_factory=list)
    # sequence index -> the error its own processors raised (filled by apply_custom; that sequence fails alone)
    failures: dict[int, Exception] = field(default_factory=dict)


def process(logits: torch.Tensor, params: RowParams) -> torch.Tensor:
    """The processor chain, in the one order above: logits [R, V] float32 (modified in place) -> [R, V]."""
    device = logits.device
    logits = apply_temperature(logits, params.temperatures.to(device))
    if params.penalties is not None and params.history is not None:
        logits = apply_repetition_penalty(logits, params.history.to(device), params.penalties.to(device))
    if params.top_p is not None:
        logits = apply_top_p(logits, params.top_p.to(device))
    if params.top_k is not None:
        logits = apply_top_k(logits, params.top_k.to(device))
    logits = apply_custom(logits, params.custom, params.rows_per_seq, params.failures)
    return mask_eos(logits, params.mask_eos.to(device), params.eos_ids.to(device))


def apply_temperature(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """logits [R, V] / temperatures [R]."""
    return logits.div_(temperatures.unsqueeze(1))


def apply_repetition_penalty(
    logits: torch.Tensor, history: torch.Tensor, penalty: torch.Tensor
) -> torch.Tensor:
    """The reference's asymmetric penalty: s*alpha where s < 0, else s/alpha, alpha = penalty**count.

    history: [R, W] int64 ids of the row's recent generated tokens, -1 = padding.
    penalty: [R] float32; 1.0 leaves a row unchanged.
    Unlike the reference, no row is exempt because of its index in the batch (its
    `max_input_ids` quirk), so a request's result does not depend on its batch position.
    """
    # Works on the W history columns, not the V vocabulary columns; values are bit-identical
    # to the reference's pow(penalty, one_hot counts) over the whole row.
    if history.shape[1] == 0:
        return logits
    valid = history >= 0  # [R, W]
    fill = history.max(dim=1, keepdim=True).values.clamp(min=0)  # a real id of the row, or 0
    ids = torch.where(valid, history, fill)  # padding repeats a real id: same value written twice
    same = (ids.unsqueeze(2) == history.unsqueeze(1)) & valid.unsqueeze(1)  # [R, W, W]
    alpha = torch.pow(penalty.unsqueeze(1), same.sum(2).to(logits.dtype))  # [R, W]
    scores = logits.gather(1, ids)  # [R, W]
    penalised = torch.where(scores < 0, scores * alpha, scores / alpha)
    # A tiny penalty's alpha underflows to 0 (0.001**16): s/0 is inf, 0/0 NaN, and softmax would give NaN.
    # Clamp to the finite range (the boosted token then wins); normal values pass through unchanged.
    big = torch.finfo(logits.dtype).max
    return logits.scatter_(1, ids, penalised.nan_to_num_(nan=0.0, posinf=big, neginf=-big))


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor, min_keep: int = 3) -> torch.Tensor:
    """HF TopP: drop the ascending-sorted tokens whose cumulative probability is <= 1 - top_p.

    top_p: [R] float32; rows with top_p >= 1 are left untouched. The `min_keep` best tokens
    always survive.
    """
    sorted_logits, order = sort_ascending(logits)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # [R, V]
    drop_sorted = cumulative <= (1 - top_p).unsqueeze(1)
    drop_sorted[:, -min_keep:] = False
    drop_sorted &= (top_p < 1).unsqueeze(1)
    drop = torch.empty_like(drop_sorted).scatter_(1, order, drop_sorted)
    return logits.masked_fill_(drop, float("-inf"))


def sort_ascending(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.sort(x, dim=-1, stable=True) for x [R, V]: values and indices, ties in index order.

    torch's CPU sort is ~10x slower than numpy's SIMD sort, and top-p sorts every row at every
    step (V = 21178 in text mode). On CPU we sort int64 keys packing (float order, index):
    the keys are unique, so the order is exactly the stable one.
    """
    if not x.is_cpu or x.dtype != torch.float32:
        return torch.sort(x, dim=-1, stable=True)
    shift = max(1, (x.shape[1] - 1).bit_length())
    bits = (x + 0.0).view(torch.int32).to(torch.int64)  # + 0.0 turns -0.0 into +0.0
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # signed ints in the floats' order
    keys = np.sort(((ordered << shift) | torch.arange(x.shape[1])).numpy(), axis=-1)
    index = torch.from_numpy(keys & ((1 << shift) - 1))
    return x.gather(1, index), index


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, min_keep: int = 3) -> torch.Tensor:
    """HF TopK: drop every score strictly below the k-th largest (ties kept), k = min(max(k, min_keep), V).

    top_k: [R] int64; rows with top_k <= 0 are left untouched.
    """
    vocab = logits.shape[1]
    active = top_k > 0  # [R]
    k = top_k.clamp(min=min_keep, max=vocab)  # [R]
    largest = logits.topk(int(k.max()), dim=-1).values  # [R, K] descending
    kth = largest.gather(1, (k - 1).unsqueeze(1))  # [R, 1]
    drop = (logits < kth) & active.unsqueeze(1)
    return logits.masked_fill_(drop, float("-inf"))


def apply_custom(logits: torch.Tensor, custom: list[tuple[int, tuple[LogitsProcessor, ...], torch.Tensor]],
                 rows_per_seq: int, failures: dict[int, Exception] | None = None) -> torch.Tensor:
    """Each sequence's own processors on its own rows [rows_per_seq, V], given its history [G, rows_per_seq].

    A processor that raises (or returns something that is not [rows_per_seq, V]) fails its own sequence only: the
    error goes to failures[s] (raised at once when failures is None) and the other rows are untouched.
    """
    for s, processors, history in custom:
        rows = slice(s * rows_per_seq, (s + 1) * rows_per_seq)
        try:
            own = logits[rows].clone()
            for fn in processors:
                own = fn(history.to(logits.device), own)
            logits[rows] = own
        except Exception as exc:  # noqa: BLE001 -- user code; its request fails, the batch goes on
            if failures is None:
                raise
            failures[s] = ValueError(f"logits_processors: {type(exc).__name__}: {exc}")
    return logits


def mask_eos(logits: torch.Tensor, rows: torch.Tensor, eos_ids: torch.Tensor) -> torch.Tensor:
    """Forbid EOS: logits[r, eos_ids[r]] = -inf where rows[r] (rows [R] bool, eos_ids [R] int64)."""
    index = rows.nonzero().squeeze(1)
    logits[index, eos_ids[index]] = float("-inf")
    return logits
