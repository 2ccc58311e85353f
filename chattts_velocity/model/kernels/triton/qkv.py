"""Model stage, CUDA backend: RMSNorm -> packed q|k|v projection -> RoPE -> paged KV store, one kernel.

In: rows x [M, H] (the residual stream), the packed weight [(heads + 2 kv_heads) * head_dim, H] (q rows, then k,
then v, as nn.Linear stores them), positions and pool slots [M]. Out: q [M, heads, head_dim] rotated, in the pools'
dtype; k (rotated) and v written to the pools at the slots (slots < 0, padding rows, write nothing).

The output columns are taken in pairs (j, j + head_dim / 2) of one head: RoPE's rotate-half partners land in the
same program as two accumulators, so the rotation is an epilogue. The K loop and its batch invariance are gemm.py's.
RoPE runs in fp32 on the projection rounded to W's dtype, as model/llama.py rotates `q.float()`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from chattts_velocity.model.kernels.triton.gemm import Tile, check_stats, options, tile_for, upcast
from chattts_velocity.model.kernels.triton.gemm_loop import (
    normed_pair_dots,
    prefetch_weights,
    release_next,
    row_scale,
    wait_previous,
)
from chattts_velocity.model.kernels.triton.rounding import to_dtype
from chattts_velocity.model.kernels.triton.split_k import Split, SplitWorkspace, launch_split, reduce_pair


@triton.jit
def _norm_qkv_rope_kernel(x_ptr, stats_ptr, norm_ptr, w_ptr, positions_ptr, slots_ptr, cos_ptr, sin_ptr, q_ptr,
                          k_cache_ptr, v_cache_ptr, part_ptr, count_ptr, M, x_stride, table_stride, eps,
                          HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HALF: tl.constexpr, PAIRS: tl.constexpr,
                          K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          SPLITS: tl.constexpr, K_SPLIT: tl.constexpr, STAT_TILES: tl.constexpr,
                          UPCAST: tl.constexpr, USE_PDL: tl.constexpr):
    # one program per (tile of BLOCK_M rows, tile of BLOCK_N column pairs, K range); pair p: head p // HALF of
    # q|k|v, columns j = p % HALF and j + HALF of that head; partials [SPLITS, M, 2 PAIRS]: first columns at p,
    # second at PAIRS + p. STAT_TILES: gemm_loop.row_scale's
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_ok = rows < M
    p = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    head, j = p // HALF, p % HALF
    p_ok = head < HEADS + 2 * KV_HEADS
    first = head * (2 * HALF) + j  # the pair's rows of W
    k_begin = tl.program_id(2) * K_SPLIT
    prefetch_weights(w_ptr, first, p_ok, k_begin, K, K_SPLIT, BLOCK_K, USE_PDL)  # the weights do not wait for x
    prefetch_weights(w_ptr, first + HALF, p_ok, k_begin, K, K_SPLIT, BLOCK_K, USE_PDL)
    wait_previous(USE_PDL)
    w_dtype = w_ptr.dtype.element_ty
    scale = row_scale(x_ptr, stats_ptr, rows, rows_ok, x_stride, eps, K, BLOCK_M, BLOCK_K, STAT_TILES)
    acc1, acc2 = normed_pair_dots(x_ptr, rows, rows_ok, x_stride, scale, norm_ptr, w_ptr, first, first + HALF, p_ok,
                                  k_begin, K, K_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K, UPCAST)
    release_next(USE_PDL)
    acc1, acc2, last = reduce_pair(part_ptr, count_ptr, acc1, acc2, rows, rows_ok, p, p_ok, M, PAIRS, SPLITS,
                                   BLOCK_M, BLOCK_N)
    if last:
        _rope_and_store(acc1, acc2, rows, rows_ok, p, head, j, first, p_ok, positions_ptr, slots_ptr, cos_ptr,
                        sin_ptr, q_ptr, k_cache_ptr, v_cache_ptr, table_stride, w_dtype, HEADS, KV_HEADS, HALF)


@triton.jit
def _rope_and_store(acc1, acc2, rows, rows_ok, p, head, j, first, p_ok, positions_ptr, slots_ptr, cos_ptr, sin_ptr,
                    q_ptr, k_cache_ptr, v_cache_ptr, table_stride, w_dtype: tl.constexpr, HEADS: tl.constexpr,
                    KV_HEADS: tl.constexpr, HALF: tl.constexpr):
    # the epilogue: the projections rounded to W's dtype, RoPE on q and k, q out, k and v into the pools
    x1 = to_dtype(acc1, w_dtype).to(tl.float32)
    x2 = to_dtype(acc2, w_dtype).to(tl.float32)
    # RoPE (rotate_half: out1 = x1 cos1 - x2 sin1, out2 = x2 cos2 + x1 sin2) on q and k heads; v passes through
    position = tl.load(positions_ptr + rows, mask=rows_ok, other=0).to(tl.int64)
    table = position[:, None] * table_stride + j[None, :]
    cos1, cos2 = tl.load(cos_ptr + table), tl.load(cos_ptr + table + HALF)
    sin1, sin2 = tl.load(sin_ptr + table), tl.load(sin_ptr + table + HALF)
    rotate = (head < HEADS + KV_HEADS)[None, :]
    out1 = tl.where(rotate, x1 * cos1 - x2 * sin1, x1)
    out2 = tl.where(rotate, x2 * cos2 + x1 * sin2, x2)
    ok = rows_ok[:, None] & p_ok[None, :]
    # q [M, HEADS * 2 HALF]
    is_q = ok & (head < HEADS)[None, :]
    q_offs = rows[:, None] * (HEADS * 2 * HALF) + first[None, :]
    tl.store(q_ptr + q_offs, to_dtype(out1, q_ptr.dtype.element_ty), mask=is_q)
    tl.store(q_ptr + q_offs + HALF, to_dtype(out2, q_ptr.dtype.element_ty), mask=is_q)
    # k and v into pool slot `slot`: [KV_HEADS * 2 HALF] values per slot
    slot = tl.load(slots_ptr + rows, mask=rows_ok, other=-1).to(tl.int64)
    kv_ok = ok & (slot >= 0)[:, None] & (head >= HEADS)[None, :]
    is_v = (head >= HEADS + KV_HEADS)[None, :]
    kv_col = (head - HEADS - tl.where(head >= HEADS + KV_HEADS, KV_HEADS, 0)) * (2 * HALF) + j
    kv_offs = slot[:, None] * (KV_HEADS * 2 * HALF) + kv_col[None, :]
    cache_dtype = k_cache_ptr.dtype.element_ty
    tl.store(k_cache_ptr + kv_offs, to_dtype(out1, cache_dtype), mask=kv_ok & ~is_v)
    tl.store(k_cache_ptr + kv_offs + HALF, to_dtype(out2, cache_dtype), mask=kv_ok & ~is_v)
    tl.store(v_cache_ptr + kv_offs, to_dtype(out1, cache_dtype), mask=kv_ok & is_v)
    tl.store(v_cache_ptr + kv_offs + HALF, to_dtype(out2, cache_dtype), mask=kv_ok & is_v)


def norm_qkv_rope(
    x: torch.Tensor, norm_weight: torch.Tensor, qkv: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
    cos_cache: torch.Tensor, sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, eps: float,
    tile: Tile | None = None, pdl: bool = False, workspace: SplitWorkspace | None = None, splits: int | None = None,
    stats: torch.Tensor | None = None,
) -> torch.Tensor:
    """RMSNorm(x) @ qkv.T, RoPE at `positions` on q and k, k and v stored at `slots` -> q [M, heads, head_dim].

    x [M, H]; norm_weight [H]; qkv [(heads + 2 kv_heads) * head_dim, H]; positions, slots [M] int;
    cos_cache, sin_cache [max_positions, head_dim] fp32 (RotaryEmbedding's); pools
    [num_blocks, block_size, kv_heads, head_dim] of one dtype, which q also takes. tile, splits, workspace: as
    gemm.residual_linear's; stats: as gemm.norm_gate_up's.
    """
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    heads = qkv.shape[0] // head_dim - 2 * kv_heads
    _check(x, norm_weight, qkv, positions, slots, cos_cache, sin_cache, k_cache, v_cache, heads)
    check_stats(x, stats)
    q = x.new_empty(x.shape[0], heads, head_dim, dtype=k_cache.dtype)
    pairs, chosen = qkv.shape[0] // 2, tile or tile_for(qkv)
    cos_cache, sin_cache = cos_cache.contiguous(), sin_cache.contiguous()

    def launch(grid: tuple[int, int, int], rows: slice, partials: torch.Tensor, counters: torch.Tensor,
               split: Split) -> None:
        _norm_qkv_rope_kernel[grid](
            x[rows], partials if stats is None else stats[rows], norm_weight, qkv, positions[rows], slots[rows],
            cos_cache, sin_cache, q[rows], k_cache, v_cache, partials, counters, rows.stop - rows.start, x.stride(0),
            cos_cache.stride(0), eps, HEADS=heads, KV_HEADS=kv_heads, HALF=head_dim // 2, PAIRS=pairs, K=x.shape[1],
            BLOCK_M=chosen.block_m, BLOCK_N=chosen.block_n, BLOCK_K=chosen.block_k, SPLITS=split.splits,
            K_SPLIT=split.k_split, STAT_TILES=0 if stats is None else stats.shape[1], UPCAST=upcast(qkv),
            USE_PDL=pdl, **options(chosen, pdl))

    launch_split(x.shape[0], pairs, 2 * pairs, x.shape[1], chosen.blocks, workspace, splits, x.device, launch)
    return q


def _check(x: torch.Tensor, norm_weight: torch.Tensor, qkv: torch.Tensor, positions: torch.Tensor,
           slots: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor, k_cache: torch.Tensor,
           v_cache: torch.Tensor, heads: int) -> None:
    kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if (x.dim() != 2 or qkv.dim() != 2 or qkv.shape[1] != x.shape[1] or heads < 1 or qkv.shape[0] % head_dim
            or head_dim % 2 or norm_weight.shape != x.shape[1:]):
        raise ValueError(f"norm_qkv_rope: need x [M, H], norm_weight [H] and qkv [(heads + 2 * {kv_heads}) * "
                         f"{head_dim}, H]; got {tuple(x.shape)}, {tuple(norm_weight.shape)}, {tuple(qkv.shape)}")
    if positions.shape != x.shape[:1] or slots.shape != x.shape[:1] or cos_cache.shape != sin_cache.shape \
            or cos_cache.shape[1] != head_dim:
        raise ValueError(f"norm_qkv_rope: positions, slots must be [{x.shape[0]}] and cos/sin [P, {head_dim}], got "
                         f"{tuple(positions.shape)}, {tuple(slots.shape)}, {tuple(cos_cache.shape)}")
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype or not k_cache.is_contiguous() \
            or not v_cache.is_contiguous() or x.stride(1) != 1 or not qkv.is_contiguous():
        raise ValueError("norm_qkv_rope: the pools must be two contiguous tensors of one shape and dtype, and x's "
                         "rows and qkv contiguous")
