"""Engine stage ops for the CUDA backend: HF top-p then HF top-k (MIN_KEEP tokens kept) without sorting the row.

Rows are logits [R, V] fp32, as in engine/worker/sampling/logits_processors.py, whose semantics these keep: the
stable ascending order of a row ranks its columns by (value, column); top-p drops the prefix of that order whose
cumulative softmax mass (summed in fp64, compared in fp32) is <= 1 - top_p, but never the MIN_KEEP last; top-k then
drops what lies below the k-th largest survivor (nothing if top-p dropped it).

NOTE (no sort): each column's rank is a 64-bit key, its value's order-preserving integer bits then its column, so
keys are distinct and ordered as the stable sort. The prefix top-p drops ends at the largest key whose mass (the
fp64 sum of the probabilities of the keys up to it) is <= 1 - top_p, and the k-th largest key is the largest one
that k keys reach: both found by one bisection over the key range (KEY_BITS halvings, each one pass over the row
summing and counting), with no scratch and no sort. A row's result depends on that row alone. The sums are fp64
tree sums where the sort path summed in sorted order: a column's fate can differ only where its cumulative mass lies
within fp64 rounding of the threshold after the cast to fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from chattts_velocity.model.kernels.triton import prefill_attention

MIN_KEEP = 3  # tokens top-p and top-k always keep, as logits_processors
COLUMN_BITS = 16  # a key's low bits: vocabularies up to 65536 columns
KEY_BITS = 32 + COLUMN_BITS + 1  # halvings that close any key range (signed 32-bit values x 2^COLUMN_BITS)
TILE = 1024  # columns per tile of a row: ChatTTS's 626-wide code rows are one tile, its text rows 21
EAGER = {"enable_fp_fusion": False}  # no fused multiply-adds, as torch's eager ops


@triton.jit
def rank_keys(x, cols, COLUMN_BITS: tl.constexpr):
    # the stable ascending order's key of each (value, column): -0.0 joins 0.0 (x + 0.0), negative values' lower
    # 31 bits flipped so the signed integers order as the floats
    bits = (x + 0.0).to(tl.int32, bitcast=True)
    return ((bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64) << COLUMN_BITS) + cols


# NOTE (interpreter): the reductions below call tl.reduce with tl.sum's / tl.max's combine functions, which is what
# tl.sum and tl.max compile to; Triton's interpreter runs them as one numpy call, where a call of the jit functions
# tl.sum / tl.max (or of any helper inside the loops) costs it ~8 ms.
@triton.jit
def _tile_weights(row_ptr, start, vocab, peak, total, lane, COLUMN_BITS: tl.constexpr, BLOCK: tl.constexpr):
    # a tile's keys [1, 1, BLOCK] and its weights [4, 1, BLOCK]: lane 0 the probabilities (fp64), the others 1 a
    # column; 0 past the row
    cols = start + tl.arange(0, BLOCK)
    ok = cols < vocab
    x = tl.load(row_ptr + cols, mask=ok, other=float("-inf"))
    bits = (x + 0.0).to(tl.int32, bitcast=True)  # rank_keys, inline
    keys = ((bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64) << COLUMN_BITS) + cols
    p = tl.where(ok, tl.div_rn(tl.exp(x - peak), total), 0.0).to(tl.float64)
    weight = tl.where((lane == 0)[:, :, None], p[None, None, :], ok.to(tl.float64)[None, None, :])
    return keys[None, None, :], weight


@triton.jit
def top_p_top_k_cut(row_ptr, vocab, top_p, top_k, MIN_KEEP: tl.constexpr, COLUMN_BITS: tl.constexpr,
                    PROBES: tl.constexpr, ROUNDS: tl.constexpr, BLOCK: tl.constexpr, ONE_TILE: tl.constexpr):
    # -> (cut, kth): a column is dropped where its key <= cut (top-p, MIN_KEEP kept) or its value < kth (top-k)
    peak = tl.full([], float("-inf"), tl.float32)
    low = tl.full([], 2**62, tl.int64)
    high = tl.full([], -2**62, tl.int64)
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        ok = cols < vocab
        x = tl.load(row_ptr + cols, mask=ok, other=float("-inf"))
        peak = tl.maximum(peak, tl.reduce(x, 0, tl.standard._elementwise_max))
        bits = (x + 0.0).to(tl.int32, bitcast=True)  # rank_keys, inline
        keys = ((bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64) << COLUMN_BITS) + cols
        low = tl.minimum(low, tl.reduce(tl.where(ok, keys, 2**62), 0, tl.standard._elementwise_min))
        high = tl.maximum(high, tl.reduce(tl.where(ok, keys, -2**62), 0, tl.standard._elementwise_max))
    total = tl.full([], 0.0, tl.float32)
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf"))
        total += tl.reduce(tl.exp(x - peak), 0, tl.standard._sum_combine)
    threshold = tl.where(top_p < 1.0, 1.0 - top_p, -1.0)  # top_p >= 1: no mass is <= -1
    # three searches side by side, one a lane, each for the largest v where its test holds: lane 0 top-p's (the
    # mass of the keys <= v is <= threshold; low - 1 = no key), lane 1 the MIN_KEEP-th largest key (at least
    # MIN_KEEP keys >= v, i.e. at most vocab - MIN_KEEP keys <= v - 1), lane 2 the k-th largest key (the same with
    # k); lane 3 idle. Each round tests PROBES evenly spaced values of [lo, hi] (a bisection at PROBES = 1) and keeps
    # the part between the last that holds and the first that fails; the answer does not depend on PROBES.
    lane = tl.arange(0, 4)[:, None]  # [4, 1]
    most = vocab - tl.where(lane == 1, tl.minimum(MIN_KEEP, vocab), tl.minimum(tl.maximum(top_k, MIN_KEEP), vocab))
    lo = tl.where(lane == 0, low - 1, low)
    hi = tl.full([4, 1], 0, tl.int64) + high
    step = tl.arange(1, PROBES + 1).to(tl.int64)[None, :]  # [1, PROBES]
    if ONE_TILE:  # vocab <= BLOCK: the row's: its keys and weights stay in registers
        keys, weight = _tile_weights(row_ptr, 0, vocab, peak, total, lane, COLUMN_BITS, BLOCK)
    for _ in range(ROUNDS):
        probe = lo + ((hi - lo) * step + PROBES) // (PROBES + 1)  # [4, PROBES]
        limit = (probe - (lane != 0))[:, :, None]  # lane 0 sums the keys <= v, the others count those <= v - 1
        if ONE_TILE:
            tally = tl.reduce(tl.where(keys <= limit, weight, 0.0), 2, tl.standard._sum_combine)
        else:
            tally = tl.full([4, PROBES], 0.0, tl.float64)
            for start in range(0, vocab, BLOCK):
                tile_keys, tile_weight = _tile_weights(row_ptr, start, vocab, peak, total, lane, COLUMN_BITS, BLOCK)
                tally += tl.reduce(tl.where(tile_keys <= limit, tile_weight, 0.0), 2, tl.standard._sum_combine)
        holds = tl.where(lane == 0, tally.to(tl.float32) <= threshold, tally <= most.to(tl.float64))  # exact counts
        open_ = lo < hi
        new_lo = tl.reduce(tl.where(holds, probe, lo), 1, tl.standard._elementwise_max)[:, None]
        new_hi = tl.reduce(tl.where(holds, hi, probe - 1), 1, tl.standard._elementwise_min)[:, None]
        lo, hi = tl.where(open_, new_lo, lo), tl.where(open_, new_hi, hi)
    lo = tl.reshape(lo, [4])
    lane = tl.arange(0, 4)
    mass_cut = tl.reduce(tl.where(lane == 0, lo, 0), 0, tl.standard._sum_combine)
    kept = tl.reduce(tl.where(lane == 1, lo, 0), 0, tl.standard._sum_combine)
    kth_key = tl.reduce(tl.where(lane == 2, lo, 0), 0, tl.standard._sum_combine)
    cut = tl.minimum(mass_cut, kept - 1)  # the MIN_KEEP largest keys stay
    # the k-th largest key's value, unless top-p dropped it (then, or with top_k <= 0, kth = -inf drops nothing)
    ordered = (kth_key >> COLUMN_BITS).to(tl.int32)
    kth = (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
    kth = tl.where((top_k > 0) & (kth_key > cut), kth, float("-inf"))
    return cut, kth


@triton.jit
def dropped(x, cols, cut, kth, COLUMN_BITS: tl.constexpr):
    # the columns top-p and top-k drop, given top_p_top_k_cut's result
    return (rank_keys(x, cols, COLUMN_BITS) <= cut) | (x < kth)


@triton.jit
def _top_p_top_k_kernel(logits_ptr, top_p_ptr, top_k_ptr, logits_stride, vocab, MIN_KEEP: tl.constexpr,
                        COLUMN_BITS: tl.constexpr, PROBES: tl.constexpr, ROUNDS: tl.constexpr,
                        BLOCK: tl.constexpr, ONE_TILE: tl.constexpr):
    # one program per row: -inf into the dropped columns
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * logits_stride
    cut, kth = top_p_top_k_cut(row_ptr, vocab, tl.load(top_p_ptr + row), tl.load(top_k_ptr + row), MIN_KEEP,
                               COLUMN_BITS, PROBES, ROUNDS, BLOCK, ONE_TILE)
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        ok = cols < vocab
        x = tl.load(row_ptr + cols, mask=ok, other=0.0)
        tl.store(row_ptr + cols, float("-inf"), mask=ok & dropped(x, cols, cut, kth, COLUMN_BITS))


def search_for(vocab: int) -> dict[str, int]:
    """The search's constexprs for rows of `vocab`: BLOCK (columns a tile, a power of two <= TILE), ONE_TILE,
    PROBES a round and ROUNDS: a bisection on a GPU (the fewest registers); 16 probes a round in Triton's
    interpreter (a quarter of the rounds, where each interpreted op costs the same). Whether kernels are
    interpreted is prefill_attention.INTERPRETED (the compile check records GPU launches by clearing it)."""
    if not 1 <= vocab <= 1 << COLUMN_BITS:
        raise ValueError(f"vocab: top-p / top-k take 1 to {1 << COLUMN_BITS} columns, got {vocab}")
    block = min(TILE, triton.next_power_of_2(vocab))
    probes = 16 if prefill_attention.INTERPRETED else 1
    halvings = (probes + 1).bit_length() - 1  # a round divides the range by probes + 1 >= 2 ** halvings
    return {"BLOCK": block, "ONE_TILE": vocab <= block, "PROBES": probes, "ROUNDS": -(-KEY_BITS // halvings) + 1}


def apply_top_p_top_k(
    logits: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor, min_keep: int = MIN_KEEP
) -> torch.Tensor:
    """HF top-p then HF top-k on logits [R, V] fp32 (modified in place and returned), one launch, no sort, no host
    sync. top_p [R] float (>= 1 = off), top_k [R] int (<= 0 = off)."""
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.stride(1) != 1:
        raise ValueError(f"logits: need [R, V] float32 with contiguous rows, got {tuple(logits.shape)} {logits.dtype}")
    rows, vocab = logits.shape
    if top_p.shape != (rows,) or top_k.shape != (rows,):
        raise ValueError(f"apply_top_p_top_k: top_p and top_k must be [{rows}], got "
                         f"{tuple(top_p.shape)} and {tuple(top_k.shape)}")
    _top_p_top_k_kernel[(rows,)](logits, top_p.float().contiguous(), top_k.long().contiguous(), logits.stride(0),
                                 vocab, MIN_KEEP=min_keep, COLUMN_BITS=COLUMN_BITS,
                                 **search_for(vocab), num_warps=4, **EAGER)
    return logits
