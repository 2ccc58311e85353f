"""Model stage, CUDA backend: varlen prefill attention over the paged KV pool in Triton (qkv.py stores the new
rows; decode steps attend with decode_attention.py).

Same layout and results as model/attention.py: per layer (K, V) pools `[num_blocks, block_size, kv_heads, head_dim]`,
pool slot s = block * block_size + offset; q/k/v rows `[N, heads, head_dim]`, q heads a multiple of kv heads (GQA).
Keys are visited in tiles of BLOCK_N positions whatever the block size (each position looks its block up), and
scores, the online softmax and the weighted sum accumulate in fp32; outputs have q's dtype.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from chattts_velocity.model.kernels.triton.gemm_loop import dot
from chattts_velocity.model.kernels.triton.rounding import to_dtype

LOG2E = 1.4426950408889634  # softmax runs in base 2: exp(x) = exp2(x * log2(e))
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # read as triton reads it, when the kernels are decorated
FMA = {"enable_fp_fusion": True}  # explicit, as Triton 3.10 flips the default: faster, equal to torch to rounding


@triton.jit
def pool_slots(table_row_ptr, t, t_ok, BLOCK_SIZE: tl.constexpr):
    # context positions t [BLOCK_N] of one sequence -> their pool slots (int64; 0 where masked)
    block = tl.load(table_row_ptr + t // BLOCK_SIZE, mask=t_ok, other=0).to(tl.int64)
    return block * BLOCK_SIZE + t % BLOCK_SIZE


@triton.jit(do_not_specialize=["table_stride"])
def _prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, tables_ptr, cu_q_ptr, k_lens_ptr, out_ptr, scale_log2,
                    q_stride, table_stride,
                    HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    # one program per (sequence, q head, tile of BLOCK_M new rows); new row i sits at position k_len - q_len + i
    seq = tl.program_id(0)
    head = tl.program_id(1)
    first_row = tl.program_id(2) * BLOCK_M
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    if first_row >= q_len:
        return
    k_len = tl.load(k_lens_ptr + seq)
    kv_col = (head // (HEADS // KV_HEADS)) * HEAD_DIM
    i = first_row + tl.arange(0, BLOCK_M)
    i_ok = i < q_len
    position = k_len - q_len + i  # [BLOCK_M]; row i sees keys 0 .. position
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_offs = (q_start + i)[:, None].to(tl.int64) * q_stride + head * HEAD_DIM + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=i_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], -float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    end = tl.minimum(k_len, k_len - q_len + first_row + BLOCK_M)  # no row of this tile sees a key >= end
    for start in range(0, end, BLOCK_N):
        t = start + tl.arange(0, BLOCK_N)
        t_ok = t < end
        offs = pool_slots(tables_ptr + seq * table_stride, t, t_ok, BLOCK_SIZE)[:, None] * (KV_HEADS * HEAD_DIM)
        offs += kv_col + d[None, :]
        tile_ok = t_ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + offs, mask=tile_ok, other=0.0)  # [BLOCK_N, BLOCK_D]
        scores = dot(q, tl.trans(k), UPCAST)
        visible = (t[None, :] <= position[:, None]) & t_ok[None, :]
        scores = tl.where(visible, scores * scale_log2, -float("inf"))  # [BLOCK_M, BLOCK_N]
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        v = tl.load(v_cache_ptr + offs, mask=tile_ok, other=0.0)
        acc = acc * alpha[:, None] + dot(to_dtype(p, v.dtype), v, UPCAST)  # P in V's dtype, as tensor cores take it
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    out = acc / l_i[:, None]  # every row sees key 0, so l_i > 0
    out_offs = (q_start + i)[:, None].to(tl.int64) * (HEADS * HEAD_DIM) + head * HEAD_DIM + d[None, :]
    tl.store(out_ptr + out_offs, to_dtype(out, out_ptr.dtype.element_ty), mask=i_ok[:, None] & d_ok[None, :])


def paged_prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_q_lens: torch.Tensor, k_lens: torch.Tensor,
    block_tables: torch.Tensor, max_q_len: int, scale: float | None = None, block_m: int | None = None,
    block_n: int = 32,
) -> torch.Tensor:
    """Varlen / chunked prefill: packed new rows q [N_new, heads, head_dim] -> [N_new, heads, head_dim].

    Sequence b owns rows cu_q_lens[b] .. cu_q_lens[b+1] - 1 (cu_q_lens [B+1] int, from 0) at positions
    k_lens[b] - q_len .. k_lens[b] - 1: they attend causally among themselves and fully to the cached context.
    Their K/V must already be in the pools (qkv.norm_qkv_rope). max_q_len (host int) sizes the grid; q is cast to the
    pools' dtype for the products, as model/llama.py does.
    """
    _check_pools(k_cache, v_cache)
    _, heads, head_dim = _check_query(q, k_cache)
    num_seqs = k_lens.shape[0]
    if cu_q_lens.shape != (num_seqs + 1,) or block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(f"paged_prefill_attention: need cu_q_lens [B+1], k_lens [B], block_tables [B, n]; got "
                         f"{tuple(cu_q_lens.shape)}, {tuple(k_lens.shape)}, {tuple(block_tables.shape)}")
    rows, block_tables = _rows(q.to(k_cache.dtype)), block_tables.contiguous()
    out = q.new_empty(q.shape)
    scale = head_dim**-0.5 if scale is None else scale
    # rows per program; 16 below head_dim 32, where 32 spilled registers on sm_89 in fp16 (compile_check). A row's
    # result does not depend on it (keys past a row's position weigh exactly 0)
    block_m = block_m or (16 if head_dim < 32 else 32)
    grid = (num_seqs, heads, triton.cdiv(max_q_len, block_m))
    _prefill_kernel[grid](
        rows, k_cache, v_cache, block_tables, cu_q_lens, k_lens, out, scale * LOG2E, rows.stride(0),
        block_tables.stride(0), HEADS=heads, KV_HEADS=k_cache.shape[2], HEAD_DIM=head_dim, BLOCK_SIZE=k_cache.shape[1],
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=block_m, BLOCK_N=block_n,
        UPCAST=k_cache.dtype == torch.float32 or INTERPRETED, **FMA)
    return out


def _rows(x: torch.Tensor) -> torch.Tensor:
    # [N, heads, head_dim] with each row's heads * head_dim values contiguous; rows may be strided
    # (q/k/v split from one fused projection), so only copy when a row itself is not contiguous
    if x.stride(2) == 1 and x.stride(1) == x.shape[2]:
        return x
    return x.contiguous()


def _check_pools(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache, v_cache: need two [num_blocks, block_size, kv_heads, head_dim] pools of one dtype,"
                         f" got {tuple(k_cache.shape)} {k_cache.dtype}, {tuple(v_cache.shape)} {v_cache.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("k_cache, v_cache: the pools must be contiguous")


def _check_query(q: torch.Tensor, k_cache: torch.Tensor) -> tuple[int, int, int]:
    if q.dim() != 3 or q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2] != 0:
        raise ValueError(f"q: need [N, heads, {k_cache.shape[3]}] with heads a multiple of {k_cache.shape[2]} "
                         f"kv heads, got {tuple(q.shape)}")
    return q.shape[0], q.shape[1], q.shape[2]
