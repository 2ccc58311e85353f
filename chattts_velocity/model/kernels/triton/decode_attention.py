"""Model stage, CUDA backend: paged decode attention, batch-invariant, the split combine in the same kernel.

One query per sequence, q [B, heads, head_dim], over its first context_lens[b] positions of the paged pools
`[num_blocks, block_size, kv_heads, head_dim]` (layout of model/attention.py) -> [B, heads, head_dim] in q's dtype.

NOTE (batch invariance): a sequence's context is cut into splits of SPLIT_LEN positions, so the number of splits
and every sum's order depend on that sequence's own context length only, never on the batch size, the table width
or the GPU. Each (sequence, head, split) program runs an fp32 online softmax over its split (tiles of BLOCK_N
positions, in order); a context of one split is normalised and written at once. Otherwise each split stores its
partial sums (acc, max, sum), and the program that finishes last (an atomic counter per sequence and head, reset
by that program) combines them, splits 0, 1, 2, ... in that order, whichever finished last.

NOTE (grid): the grid is (sequences, heads, programs), `programs` a power of two from `split_programs`; program p
of a (sequence, head) runs splits p, p + programs, p + 2 programs, ... of that sequence's own context and exits at
once where it has none. Which program runs a split never changes what it computes, so `programs` may follow the
batch and the step's longest context without touching a row's bits. With CUDA graphs a launch's grid is frozen at
capture, so rather than one graph per (batch size, context bucket) — six times the graphs and their capture at
max_model_len 4096, and the host choosing a graph by the step's longest context — a graph keeps the grid its batch
size gives (`split_programs(rows, heads)`: about PROGRAM_TARGET programs at most, never more than the table's
splits) and a longer context makes its programs loop over more splits instead of launching more empty ones. Eager
launches that know the step's longest context (`max_context`) bucket it: programs = the power of two >= its splits,
if fewer.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from chattts_velocity.model.kernels.triton.gemm import Tile, options, release_next, wait_previous
from chattts_velocity.model.kernels.triton.prefill_attention import LOG2E, pool_slots
from chattts_velocity.model.kernels.triton.rounding import to_dtype

SPLIT_LEN = 128  # context positions per split: at a 500-position context, 4 splits x 12 heads programs per sequence
BLOCK_N = 32  # positions per tile: a [32, head_dim] fp32 tile of K and of V per program (64 spilled on sm_89)
ATTENTION_TILE = Tile(block_m=1, block_n=BLOCK_N, block_k=1, num_warps=4)
# programs a launch aims at (sequences x heads x split programs): two waves of 4-warp programs on a 132-SM card.
# At ChatTTS's 12 heads: 1 row -> 32 split programs (capped by 4096 / 128 splits), 64 rows -> 4, 256 rows -> 1
PROGRAM_TARGET = 4096


def split_programs(rows: int, heads: int, table_splits: int, max_context: int | None = None,
                   split_len: int = SPLIT_LEN) -> int:
    """Programs per (sequence, head) of a launch: the largest power of two that keeps rows x heads x programs
    within PROGRAM_TARGET (at least 1), at most the power of two >= the table's splits, or >= the splits of
    `max_context` (the step's longest context, where the caller knows it)."""
    wanted = table_splits if max_context is None else min(table_splits, max(1, -(-max_context // split_len)))
    by_rows = 1 << max(0, (PROGRAM_TARGET // max(1, rows * heads)).bit_length() - 1)  # a power of two <= the target
    bucket = 1 << max(0, wanted - 1).bit_length()  # the power of two >= wanted
    return max(1, min(by_rows, bucket))


class Workspace(NamedTuple):
    """Scratch the kernel reuses across launches: partial sums [rows, heads, splits, head_dim + 2] fp32 and one
    counter per (row, head) int32, zero between launches (the combining program resets its counter)."""

    partials: torch.Tensor
    counters: torch.Tensor

    @classmethod
    def allocate(cls, rows: int, heads: int, max_context: int, head_dim: int, device: torch.device,
                 split_len: int = SPLIT_LEN) -> Workspace:
        splits = max(1, triton.cdiv(max_context, split_len))
        return cls(torch.empty(rows, heads, splits, head_dim + 2, dtype=torch.float32, device=device),
                   torch.zeros(rows * heads, dtype=torch.int32, device=device))

    def fits(self, rows: int, heads: int, splits: int) -> bool:
        return self.partials.shape[0] >= rows and self.partials.shape[1] == heads and self.partials.shape[2] >= splits


@triton.jit(do_not_specialize=["table_stride"])
def _decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, tables_ptr, lens_ptr, out_ptr, part_ptr, count_ptr, scale_log2,
                   q_stride, table_stride, part_splits,
                   HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_LEN: tl.constexpr, USE_PDL: tl.constexpr):
    # one program per (sequence, q head, split program); program p runs splits p, p + P, ... (P = the grid's third
    # size) of its sequence's context; one with none exits at once
    wait_previous(USE_PDL)
    seq = tl.program_id(0)
    head = tl.program_id(1)
    context_len = tl.load(lens_ptr + seq)
    num_splits = tl.maximum(tl.cdiv(context_len, SPLIT_LEN), 1)
    kv_col = (head // (HEADS // KV_HEADS)) * HEAD_DIM
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(q_ptr + seq * q_stride + head * HEAD_DIM + d, mask=d_ok, other=0.0).to(tl.float32) * scale_log2
    out_row = out_ptr + (seq * HEADS + head) * HEAD_DIM + d
    base = part_ptr + (seq * HEADS + head) * part_splits * (HEAD_DIM + 2)
    counter = count_ptr + seq * HEADS + head
    table = tables_ptr + seq * table_stride
    for split in range(tl.program_id(2), num_splits, tl.num_programs(2)):
        begin = split * SPLIT_LEN
        end = tl.minimum(begin + SPLIT_LEN, context_len)
        m_i = -float("inf")  # running max of the scores (base 2)
        l_i = 0.0  # running sum of exp2(score - m_i)
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        for start in range(begin, end, BLOCK_N):
            t = start + tl.arange(0, BLOCK_N)
            t_ok = t < end
            offs = pool_slots(table, t, t_ok, BLOCK_SIZE)[:, None] * (KV_HEADS * HEAD_DIM) + kv_col + d[None, :]
            tile_ok = t_ok[:, None] & d_ok[None, :]
            k = tl.load(k_cache_ptr + offs, mask=tile_ok, other=0.0).to(tl.float32)  # [BLOCK_N, BLOCK_D]
            scores = tl.where(t_ok, tl.sum(k * q[None, :], 1), -float("inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 0))
            p = tl.exp2(scores - m_new)
            alpha = tl.exp2(m_i - m_new)
            v = tl.load(v_cache_ptr + offs, mask=tile_ok, other=0.0).to(tl.float32)
            acc = acc * alpha + tl.sum(p[:, None] * v, 0)
            l_i = l_i * alpha + tl.sum(p, 0)
            m_i = m_new
        if num_splits == 1:
            out = acc / tl.where(l_i > 0, l_i, 1.0)  # context_len 0 (a padding entry): acc is 0, so zeros, not NaN
            tl.store(out_row, to_dtype(out, out_ptr.dtype.element_ty), mask=d_ok)
        else:
            row = base + split * (HEAD_DIM + 2)
            tl.store(row + d, acc, mask=d_ok)
            tl.store(row + HEAD_DIM, m_i)
            tl.store(row + HEAD_DIM + 1, l_i)
            tl.debug_barrier()  # every thread's partial stores precede the release below
            if tl.atomic_add(counter, 1, sem="acq_rel") == num_splits - 1:
                _combine(base, out_row, d, d_ok, num_splits, HEAD_DIM, BLOCK_D)
                tl.store(counter, 0)
    release_next(USE_PDL)


@triton.jit
def _combine(base, out_row, d, d_ok, num_splits, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    # the splits' partial sums rescaled to one max and summed in split order; .cg: read from L2, not a stale L1
    m_max = -float("inf")
    for s in range(0, num_splits):
        m_max = tl.maximum(m_max, tl.load(base + s * (HEAD_DIM + 2) + HEAD_DIM, cache_modifier=".cg"))
    total = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s in range(0, num_splits):
        row = base + s * (HEAD_DIM + 2)
        weight = tl.exp2(tl.load(row + HEAD_DIM, cache_modifier=".cg") - m_max)
        total += weight * tl.load(row + HEAD_DIM + 1, cache_modifier=".cg")
        acc += weight * tl.load(row + d, mask=d_ok, other=0.0, cache_modifier=".cg")
    out = acc / total  # every split of a context > SPLIT_LEN holds at least one position: total > 0
    tl.store(out_row, to_dtype(out, out_row.dtype.element_ty), mask=d_ok)


def paged_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, workspace: Workspace | None = None, scale: float | None = None,
    split_len: int = SPLIT_LEN, pdl: bool = False, max_context: int | None = None,
) -> torch.Tensor:
    """q [B, heads, head_dim] over the first context_lens[b] positions (block_tables [B, n] int, entries past a
    context never read; context_lens [B] int) -> [B, heads, head_dim]. Launches one kernel.

    workspace: reused scratch (Workspace.allocate for at least B rows and n * block_size positions); None
    allocates one for this call. split_len: positions per split, a multiple of BLOCK_N. max_context: the longest
    context_lens entry if the caller knows it (fewer programs; None: as the table allows, what a graph captures).
    """
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype \
            or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache, v_cache: need two contiguous [num_blocks, block_size, kv_heads, head_dim] pools "
                         f"of one dtype, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if q.dim() != 3 or q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2] != 0:
        raise ValueError(f"q: need [B, heads, {k_cache.shape[3]}] with heads a multiple of {k_cache.shape[2]} "
                         f"kv heads, got {tuple(q.shape)}")
    num_seqs, heads, head_dim = q.shape
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs or context_lens.shape != (num_seqs,):
        raise ValueError(f"paged_decode_attention: block_tables must be [{num_seqs}, n] and context_lens "
                         f"[{num_seqs}], got {tuple(block_tables.shape)} and {tuple(context_lens.shape)}")
    if split_len % BLOCK_N:
        raise ValueError(f"split_len: must be a multiple of {BLOCK_N}, got {split_len}")
    q, block_tables = q.contiguous(), block_tables.contiguous()
    max_context = block_tables.shape[1] * k_cache.shape[1]
    splits = max(1, triton.cdiv(max_context, split_len))
    if workspace is None or not workspace.fits(num_seqs, heads, splits):
        workspace = Workspace.allocate(num_seqs, heads, max_context, head_dim, q.device, split_len)
    out = q.new_empty(q.shape)
    scale = head_dim**-0.5 if scale is None else scale
    programs = split_programs(num_seqs, heads, splits, max_context, split_len)
    _decode_kernel[(num_seqs, heads, programs)](
        q, k_cache, v_cache, block_tables, context_lens, out, workspace.partials, workspace.counters, scale * LOG2E,
        q.stride(0), block_tables.stride(0), workspace.partials.shape[2], HEADS=heads, KV_HEADS=k_cache.shape[2],
        HEAD_DIM=head_dim, BLOCK_SIZE=k_cache.shape[1], BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_N=BLOCK_N,
        SPLIT_LEN=split_len, USE_PDL=pdl, **options(ATTENTION_TILE, pdl))
    return out
