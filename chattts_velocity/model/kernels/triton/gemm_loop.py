"""Model stage, CUDA backend: the pieces of the fused GEMMs' K loop (gemm.py, qkv.py), in Triton.

A program owns BLOCK_M rows of x [M, K] and BLOCK_N rows of the weight W [N, K] (output columns) over one K range
[k_begin, k_begin + K_SPLIT) and walks it in BLOCK_K chunks, in order, into fp32 accumulators [BLOCK_M, BLOCK_N].

NOTE (the loads the pipeliner can make asynchronous): the loop runs over chunk indices from a start that is a
multiple of K_SPLIT, and the K bound is masked only when BLOCK_K does not divide K, so Triton sees 16-byte aligned,
unmasked-along-K rows and turns the loads into cp.async (sm_80/89) or TMA-fed wgmma operands (sm_90), `num_stages`
deep. A mask that varies along K (a dynamic `cols < K`) forces 2-byte loads and no pipelining.
"""
from __future__ import annotations

import triton
import triton.language as tl

from chattts_velocity.model.kernels.triton.rounding import to_dtype


@triton.jit
def wait_previous(USE_PDL: tl.constexpr):
    # with PDL the kernel may start before the previous one ends: wait for its writes before reading any of them
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def release_next(USE_PDL: tl.constexpr):
    # let the next kernel's programs start launching (they wait in wait_previous for this one to finish)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_weights(w_ptr, w_rows, w_rows_ok, k_begin, K: tl.constexpr, K_SPLIT: tl.constexpr,
                     BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr):
    # before wait_previous: ask L2 for this program's whole weight slice W[w_rows, k_begin : k_begin + K_SPLIT], one
    # prefetch per (row, BLOCK_K chunk) -- a chunk is one 128-byte line (64 bf16/fp16 or 32 fp32 values) -- so the
    # weights stream from HBM while the previous kernel still runs and the K loop then reads them from L2. Only with
    # PDL (compiled for sm_90+): without it the previous kernel has ended before this one starts
    if USE_PDL:
        lines = tl.arange(0, 4)
        for c0 in range(0, K_SPLIT // BLOCK_K, 4):
            chunk = c0 + lines
            ok = w_rows_ok[:, None] & (chunk < K_SPLIT // BLOCK_K)[None, :]
            address = w_ptr + w_rows[:, None].to(tl.int64) * K + (k_begin + chunk * BLOCK_K)[None, :]
            tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }", "=r,l,r",
                [address, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def dot(a, b, UPCAST: tl.constexpr):
    # a [BM, BK] @ b [BK, BN] -> fp32. UPCAST: fp32 weights (IEEE products, no TF32) and the CPU interpreter,
    # whose tl.dot multiplies bf16 bit patterns as integers; the operands are already rounded to W's dtype
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out


@triton.jit
def as_dtype(x, DTYPE: tl.constexpr):
    # to_dtype, and no conversion at all when x already has DTYPE (the load then feeds tl.dot directly)
    if x.dtype == DTYPE:
        out = x
    else:
        out = to_dtype(x, DTYPE)
    return out


@triton.jit
def x_chunk(x_ptr, rows, rows_ok, x_stride, cols, K: tl.constexpr, BLOCK_K: tl.constexpr):
    # x[rows, cols] [BLOCK_M, BLOCK_K]; rows past M read 0 (no memory traffic). The K bound only where BLOCK_K
    # does not divide K (a mask that varies along K would stop the loads being vectorised: the module's note)
    offs = x_ptr + rows[:, None] * x_stride + cols[None, :]
    if K % BLOCK_K == 0:
        x = tl.load(offs, mask=rows_ok[:, None], other=0.0)
    else:
        x = tl.load(offs, mask=rows_ok[:, None] & (cols < K)[None, :], other=0.0)
    return x


@triton.jit
def weight_chunk(w_ptr, w_rows, w_rows_ok, cols, K: tl.constexpr, BLOCK_K: tl.constexpr):
    # W[w_rows, cols] transposed: [BLOCK_K, BLOCK_N]; the K bound as in x_chunk
    offs = w_ptr + w_rows[None, :].to(tl.int64) * K + cols[:, None]
    if K % BLOCK_K == 0:
        w = tl.load(offs, mask=w_rows_ok[None, :], other=0.0)
    else:
        w = tl.load(offs, mask=w_rows_ok[None, :] & (cols < K)[:, None], other=0.0)
    return w


@triton.jit
def row_scale(x_ptr, stats_ptr, rows, rows_ok, x_stride, eps, K: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_K: tl.constexpr, STAT_TILES: tl.constexpr):
    # 1 / rms of each row [BLOCK_M] in fp32. STAT_TILES > 0: from stats [M, STAT_TILES], the sums of squares of the
    # row's column tiles that the GEMM which wrote x left (gemm.residual_linear), added in tile order -- the
    # statistics are read once per row, not recomputed by every program of the split. 0: from x, chunk by chunk
    total = tl.zeros([BLOCK_M], dtype=tl.float32)
    if STAT_TILES > 0:
        for t in range(STAT_TILES):
            total += tl.load(stats_ptr + rows * STAT_TILES + t, mask=rows_ok, other=0.0)
    else:
        for k0 in range(0, K, BLOCK_K):
            x = x_chunk(x_ptr, rows, rows_ok, x_stride, k0 + tl.arange(0, BLOCK_K), K, BLOCK_K).to(tl.float32)
            total += tl.sum(x * x, 1)
    return tl.rsqrt(total / K + eps)


@triton.jit
def normed_chunk(x_ptr, rows, rows_ok, x_stride, scale, norm_ptr, cols, K: tl.constexpr, BLOCK_K: tl.constexpr,
                 W_DTYPE: tl.constexpr):
    # the RMSNorm'd rows' columns `cols` [BLOCK_M, BLOCK_K] in W's dtype: (x * scale) in x's dtype, times the weight
    x = x_chunk(x_ptr, rows, rows_ok, x_stride, cols, K, BLOCK_K)
    normed = to_dtype(x.to(tl.float32) * scale[:, None], x_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(norm_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
    return to_dtype(weight[None, :] * normed, W_DTYPE)


@triton.jit
def normed_pair_dots(x_ptr, rows, rows_ok, x_stride, scale, norm_ptr, w_ptr, first, second, w_ok, k_begin,
                     K: tl.constexpr, K_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    # the RMSNorm'd rows over K [k_begin, k_begin + K_SPLIT) times W's rows `first` and `second` [BLOCK_N each]:
    # two fp32 accumulators [BLOCK_M, BLOCK_N], K chunks in order
    w_dtype = w_ptr.dtype.element_ty
    acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for chunk in range(0, K_SPLIT // BLOCK_K):
        cols = k_begin + chunk * BLOCK_K + tl.arange(0, BLOCK_K)
        a = normed_chunk(x_ptr, rows, rows_ok, x_stride, scale, norm_ptr, cols, K, BLOCK_K, w_dtype)
        acc1 += dot(a, weight_chunk(w_ptr, first, w_ok, cols, K, BLOCK_K), UPCAST)
        acc2 += dot(a, weight_chunk(w_ptr, second, w_ok, cols, K, BLOCK_K), UPCAST)
    return acc1, acc2


@triton.jit
def linear_dots(x_ptr, rows, rows_ok, x_stride, w_ptr, n, n_ok, k_begin, K: tl.constexpr, K_SPLIT: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    # x's rows over K [k_begin, k_begin + K_SPLIT) times W's rows n: one fp32 accumulator, K chunks in order
    w_dtype = w_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for chunk in range(0, K_SPLIT // BLOCK_K):
        cols = k_begin + chunk * BLOCK_K + tl.arange(0, BLOCK_K)
        x = x_chunk(x_ptr, rows, rows_ok, x_stride, cols, K, BLOCK_K)
        acc += dot(as_dtype(x, w_dtype), weight_chunk(w_ptr, n, n_ok, cols, K, BLOCK_K), UPCAST)
    return acc


@triton.jit
def store_row_stats(stats_ptr, stored, rows, rows_ok, ok):
    # the sums of squares of this program's output tile [BLOCK_M, BLOCK_N] (as stored) into stats [M, column tiles]
    # at column tile program_id(1): the next RMSNorm's statistics (row_scale)
    values = tl.where(ok, stored * stored, 0.0)
    tl.store(stats_ptr + rows * tl.num_programs(1) + tl.program_id(1), tl.sum(values, 1), mask=rows_ok)
