"""Model stage, CUDA backend: the decode layer's GEMMs with their neighbours fused, batch-invariant.

Three kernels over rows x [M, K] and a weight W [N, K] (nn.Linear's layout, packed once at load):
`residual_linear` (out = residual + x @ W.T: the o and down projections with the residual add; `linear`, without
the residual: the heads on CUDA),
`norm_gate_up` (RMSNorm of x, then gate|up = normed @ W.T and SiLU(gate) * up) and, in qkv.py, the RMSNorm -> q|k|v
projection with RoPE and the KV store.

NOTE (batch invariance): the tile configuration (`tile_for`) depends on the weight's dtype only and the split of K
(split_k.py) on the weight's shape and tile only, never on M: M only sets the grid. A row's K loop (BLOCK_K chunks
in order within each K range, fp32 accumulation, the ranges' partials added in range order) and its norm's sum of
squares are the same alone and in a batch of any size, so a row's bits do not depend on the other rows.
Roundings follow the torch layers: the normed row in x's dtype times the norm weight, the product in W's dtype
(tensor cores take both operands in W's dtype), each projection's output rounded to W's dtype as cuBLAS returns it.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from chattts_velocity.model.kernels.triton.rounding import to_dtype
from chattts_velocity.model.kernels.triton.split_k import Split, SplitWorkspace, launch_split, reduce_one, reduce_pair

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # read as triton reads it, when the kernels are decorated


class Tile(NamedTuple):
    """One GEMM tile configuration: rows, output columns (pairs of columns in the two-output kernels) and the K
    chunk per step of the K loop; the same for every M (see the module's note)."""

    block_m: int = 16
    block_n: int = 16
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3  # software pipelining of the K loop's loads (Triton's default)

    @property
    def blocks(self) -> tuple[int, int, int]:
        return self.block_m, self.block_n, self.block_k


# 16 output columns (pairs in the two-output kernels) a program: at one row the grid still has 48-192 programs for
# ChatTTS's widths (no split-K to fill the GPU). With 64 columns and K chunks of 64 the fp32 (FMA) products and the
# bf16 q|k|v kernel spilled registers (compile_check)
HALF_TILE = Tile(block_n=16, block_k=64)  # bf16 / fp16 weights: tensor cores
FP32_TILE = Tile(block_n=16, block_k=32)  # fp32 weights: FMA products, which hold both operands in registers


def tile_for(weight: torch.Tensor) -> Tile:
    return FP32_TILE if weight.dtype == torch.float32 else HALF_TILE


def options(tile: Tile, pdl: bool) -> dict[str, object]:
    """Launch options every fused kernel takes: FMA contraction on, warps, and Programmatic Dependent Launch."""
    extra: dict[str, object] = {"launch_pdl": True} if pdl else {}
    return {"enable_fp_fusion": True, "num_warps": tile.num_warps, "num_stages": tile.num_stages, **extra}


def pdl_available(device: torch.device) -> bool:
    """PDL (gdc_wait at each kernel's start): Hopper or newer, compiled (not interpreted), a Triton that has it."""
    if INTERPRETED or device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return False
    from triton.language.extra import cuda

    return hasattr(cuda, "gdc_wait") and hasattr(cuda, "gdc_launch_dependents")


@triton.jit
def wait_previous(USE_PDL: tl.constexpr):
    # with PDL the kernel may start before the previous one ends: wait for its writes before reading anything
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def release_next(USE_PDL: tl.constexpr):
    # let the next kernel's programs start launching (they wait in wait_previous for this one to finish)
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()


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
def rms_scale(x_ptr, rows, rows_ok, x_stride, eps, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    # 1 / rms of each row [BLOCK_M] in fp32: the sum of squares chunk by chunk, in the same order for every M
    total = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=rows_ok[:, None] & (cols < K)[None, :],
                    other=0.0).to(tl.float32)
        total += tl.sum(x * x, 1)
    return tl.rsqrt(total / K + eps)


@triton.jit
def normed_chunk(x_ptr, rows, rows_ok, x_stride, scale, norm_ptr, cols, K: tl.constexpr, W_DTYPE: tl.constexpr):
    # the RMSNorm'd rows' columns `cols` [BLOCK_M, BLOCK_K] in W's dtype: (x * scale) in x's dtype, times the weight
    x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=rows_ok[:, None] & (cols < K)[None, :],
                other=0.0)
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
    for k0 in range(k_begin, k_begin + K_SPLIT, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        a = normed_chunk(x_ptr, rows, rows_ok, x_stride, scale, norm_ptr, cols, K, w_dtype)
        acc1 += dot(a, weight_chunk(w_ptr, first, w_ok, cols, K), UPCAST)
        acc2 += dot(a, weight_chunk(w_ptr, second, w_ok, cols, K), UPCAST)
    return acc1, acc2


@triton.jit
def weight_chunk(w_ptr, w_rows, w_rows_ok, cols, K: tl.constexpr):
    # W[w_rows, cols] transposed: [BLOCK_K, BLOCK_N]
    return tl.load(w_ptr + w_rows[None, :].to(tl.int64) * K + cols[:, None],
                   mask=w_rows_ok[None, :] & (cols < K)[:, None], other=0.0)


@triton.jit
def _residual_linear_kernel(x_ptr, w_ptr, residual_ptr, out_ptr, part_ptr, count_ptr, M, x_stride,
                            N: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, SPLITS: tl.constexpr, K_SPLIT: tl.constexpr,
                            UPCAST: tl.constexpr, USE_PDL: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    # one program per (tile of BLOCK_M rows, tile of BLOCK_N output columns, K range): out = residual + x @ W.T
    # (x @ W.T without HAS_RESIDUAL; residual_ptr is not read)
    wait_previous(USE_PDL)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_ok = rows < M
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    w_dtype = w_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_begin = tl.program_id(2) * K_SPLIT
    for k0 in range(k_begin, k_begin + K_SPLIT, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=rows_ok[:, None] & (cols < K)[None, :],
                    other=0.0)
        acc += dot(to_dtype(x, w_dtype), weight_chunk(w_ptr, n, n_ok, cols, K), UPCAST)
    release_next(USE_PDL)
    acc, last = reduce_one(part_ptr, count_ptr, acc, rows, rows_ok, n, n_ok, M, N, SPLITS, BLOCK_M, BLOCK_N)
    if last:
        offs = rows[:, None] * N + n[None, :]
        ok = rows_ok[:, None] & n_ok[None, :]
        out = to_dtype(acc, w_dtype).to(tl.float32)
        if HAS_RESIDUAL:
            out += tl.load(residual_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, to_dtype(out, out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _norm_gate_up_kernel(x_ptr, norm_ptr, w_ptr, out_ptr, part_ptr, count_ptr, M, x_stride, eps,
                         INTER: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, SPLITS: tl.constexpr, K_SPLIT: tl.constexpr,
                         UPCAST: tl.constexpr, USE_PDL: tl.constexpr):
    # one program per (tile of rows, tile of BLOCK_N of the INTER columns, K range): W rows n (gate) and INTER + n
    # (up); partials [SPLITS, M, 2 INTER]: gate at n, up at INTER + n
    wait_previous(USE_PDL)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_ok = rows < M
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < INTER
    w_dtype = w_ptr.dtype.element_ty
    scale = rms_scale(x_ptr, rows, rows_ok, x_stride, eps, K, BLOCK_M, BLOCK_K)
    gate, up = normed_pair_dots(x_ptr, rows, rows_ok, x_stride, scale, norm_ptr, w_ptr, n, n + INTER, n_ok,
                                tl.program_id(2) * K_SPLIT, K, K_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K, UPCAST)
    release_next(USE_PDL)
    gate, up, last = reduce_pair(part_ptr, count_ptr, gate, up, rows, rows_ok, n, n_ok, M, INTER, SPLITS, BLOCK_M,
                                 BLOCK_N)
    if last:
        gate = to_dtype(gate, w_dtype).to(tl.float32)
        silu = to_dtype(gate / (1.0 + tl.exp(-gate)), w_dtype).to(tl.float32)
        out = silu * to_dtype(up, w_dtype).to(tl.float32)
        tl.store(out_ptr + rows[:, None] * INTER + n[None, :], to_dtype(out, out_ptr.dtype.element_ty),
                 mask=rows_ok[:, None] & n_ok[None, :])


def residual_linear(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, tile: Tile | None = None,
                    pdl: bool = False, workspace: SplitWorkspace | None = None,
                    splits: int | None = None) -> torch.Tensor:
    """residual + x @ weight.T: x [M, K], weight [N, K], residual [M, N] -> [M, N] in residual's dtype.
    tile, splits: None for tile_for(weight) and split_k's choice (tests and benchmarks pass others); workspace:
    the split-K scratch to reuse (None: one for this call)."""
    _check_linear("residual_linear", x, weight)
    if residual.shape != (x.shape[0], weight.shape[0]) or not residual.is_contiguous():
        raise ValueError(f"residual_linear: residual must be a contiguous [{x.shape[0]}, {weight.shape[0]}], "
                         f"got {tuple(residual.shape)}")
    out = torch.empty_like(residual)
    _linear_into(x, weight, residual, out, tile or tile_for(weight), pdl, workspace, splits)
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, tile: Tile | None = None, workspace: SplitWorkspace | None = None,
           splits: int | None = None) -> torch.Tensor:
    """x @ weight.T: x [M, K], weight [N, K] -> [M, N] float32 (the product rounded to weight's dtype, as cuBLAS
    returns it). Row-invariant where cuBLAS is not (it picks kernels, split-K among them, by M): the engine's heads
    on CUDA (Embed.head_gemm)."""
    _check_linear("linear", x, weight)
    out = x.new_empty(x.shape[0], weight.shape[0], dtype=torch.float32)
    _linear_into(x, weight, None, out, tile or tile_for(weight), False, workspace, splits)
    return out


def _linear_into(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None, out: torch.Tensor, tile: Tile,
                 pdl: bool, workspace: SplitWorkspace | None, splits: int | None) -> None:
    n, k = weight.shape

    def launch(grid: tuple[int, int, int], rows: slice, partials: torch.Tensor, counters: torch.Tensor,
               split: Split) -> None:
        _residual_linear_kernel[grid](
            x[rows], weight, out[rows] if residual is None else residual[rows], out[rows], partials, counters,
            rows.stop - rows.start, x.stride(0), N=n, K=k, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
            BLOCK_K=tile.block_k, SPLITS=split.splits, K_SPLIT=split.k_split, UPCAST=upcast(weight), USE_PDL=pdl,
            HAS_RESIDUAL=residual is not None, **options(tile, pdl))

    launch_split(x.shape[0], n, n, k, tile.blocks, workspace, splits, x.device, launch)


def norm_gate_up(x: torch.Tensor, norm_weight: torch.Tensor, gate_up: torch.Tensor, eps: float,
                 tile: Tile | None = None, pdl: bool = False, workspace: SplitWorkspace | None = None,
                 splits: int | None = None) -> torch.Tensor:
    """SiLU(gate) * up of RMSNorm(x): x [M, K], norm_weight [K], gate_up [2I, K] (gate rows, then up) -> [M, I]
    in x's dtype."""
    _check_linear("norm_gate_up", x, gate_up)
    if gate_up.shape[0] % 2 or norm_weight.shape != x.shape[1:]:
        raise ValueError(f"norm_gate_up: need gate_up [2I, {x.shape[1]}] and norm_weight [{x.shape[1]}], got "
                         f"{tuple(gate_up.shape)} and {tuple(norm_weight.shape)}")
    inter, k = gate_up.shape[0] // 2, x.shape[1]
    out, chosen = x.new_empty(x.shape[0], inter), tile or tile_for(gate_up)

    def launch(grid: tuple[int, int, int], rows: slice, partials: torch.Tensor, counters: torch.Tensor,
               split: Split) -> None:
        _norm_gate_up_kernel[grid](
            x[rows], norm_weight, gate_up, out[rows], partials, counters, rows.stop - rows.start, x.stride(0), eps,
            INTER=inter, K=k, BLOCK_M=chosen.block_m, BLOCK_N=chosen.block_n, BLOCK_K=chosen.block_k,
            SPLITS=split.splits, K_SPLIT=split.k_split, UPCAST=upcast(gate_up), USE_PDL=pdl, **options(chosen, pdl))

    launch_split(x.shape[0], inter, 2 * inter, k, chosen.blocks, workspace, splits, x.device, launch)
    return out


def upcast(weight: torch.Tensor) -> bool:
    """Products in fp32 through tl.dot: fp32 weights (no TF32), and always in the interpreter."""
    return weight.dtype == torch.float32 or INTERPRETED


def _check_linear(name: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"{name}: x must be [M, K] and the weight [N, K], got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    if x.stride(1) != 1 or not weight.is_contiguous():
        raise ValueError(f"{name}: x's rows and the weight must be contiguous")
