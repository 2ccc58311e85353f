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

The RMSNorm statistics are computed once per row: residual_linear's epilogue (o and down: the kernels that write
the residual stream) stores each output row's sum of squares per column tile (`stats`), and the next norm kernel
adds those partials in tile order instead of every program of its split re-reading x (gemm_loop.row_scale). Only the
first layer's q|k|v kernel, whose input is the embedding, sums x itself.

NOTE (overlap): with PDL (sm_90+) each kernel first asks L2 for its whole weight slice (gemm_loop.prefetch_weights),
then waits for the previous kernel (gdc_wait) and only then reads x, the statistics and the residual; it lets the
next kernel launch (gdc_launch_dependents) when its K loop is done. The weights, which no kernel writes, stream from
HBM while the previous kernel (the attention, the previous GEMM) still runs.
Roundings follow the torch layers: the normed row in x's dtype times the norm weight, the product in W's dtype
(tensor cores take both operands in W's dtype), each projection's output rounded to W's dtype as cuBLAS returns it.
"""
from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from chattts_velocity.model.kernels.triton.gemm_loop import (
    linear_dots,
    normed_pair_dots,
    prefetch_weights,
    row_scale,
    store_row_stats,
)
from chattts_velocity.model.kernels.triton.gemm_loop import release_next as release_next  # the attention's too
from chattts_velocity.model.kernels.triton.gemm_loop import wait_previous as wait_previous
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
    maxnreg: int | None = None  # registers a thread may use (None: ptxas's choice)

    @property
    def blocks(self) -> tuple[int, int, int]:
        return self.block_m, self.block_n, self.block_k


# bf16 / fp16 weights: 64 rows x 32 output columns (pairs: 64 weight rows in the two-output kernels) x K chunks of
# 64, 4 warps (one warpgroup), 4 stages. Why this shape:
# - tensor cores at every batch size: a 64-row tile is wgmma's native M on sm_90 (m64n32k16; one warpgroup) and
#   four m16n8k16 mma.sync row blocks on sm_80/89. Decode batches of fewer rows mask the rest: masked rows read no
#   memory and the wasted multiply-adds are free next to the weight traffic that bounds decode.
# - the weights stream: the K loop runs num_stages chunks ahead with cp.async (sm_80/89/90; gemm_loop's note), so a
#   program keeps ~3 weight tiles (4-8 KB each) in flight, and a weight is read once per 64 rows, not per 16 (at 256
#   rows: 4 reads, mostly from L2). Swapping the operands (W's rows on the MMA's M side, the batch on N = 16) would
#   waste less of the MMA at one row but re-read the weights once per 16 rows at large batches.
# - 32 columns, not 64: one row tile of ChatTTS's GEMMs still has 24-96 column tiles for split-K to fill the card
#   with (split_k.py), and the two-output kernels' accumulators stay at ~130 registers without spills.
# - one shape for every M: a row's K order and MMA shape, and so its bits, are the same alone and among 256.
# - at most 168 registers: left to itself ptxas held the first layer's q|k|v kernel (which sums its rows' squares
#   too) at 128 on sm_80 and spilled; it needs ~162 (three programs an SM).
# fp32 weights (IEEE FMA products, no TF32: their bits must match the fp32 reference) keep 16 x 16 tiles with K
# chunks of 32; wider ones spilled registers (compile_check).
HALF_TILE = Tile(block_m=64, block_n=32, block_k=64, num_warps=4, num_stages=4, maxnreg=168)
FP32_TILE = Tile(block_n=16, block_k=32)


def tile_for(weight: torch.Tensor) -> Tile:
    return FP32_TILE if weight.dtype == torch.float32 else HALF_TILE


def options(tile: Tile, pdl: bool) -> dict[str, object]:
    """Launch options every fused kernel takes: FMA contraction on, warps, and Programmatic Dependent Launch."""
    extra: dict[str, object] = {"launch_pdl": True} if pdl else {}
    if tile.maxnreg is not None:
        extra["maxnreg"] = tile.maxnreg
    return {"enable_fp_fusion": True, "num_warps": tile.num_warps, "num_stages": tile.num_stages, **extra}


def pdl_available(device: torch.device) -> bool:
    """PDL (gdc_wait after each kernel's weight prefetch): Hopper or newer, compiled (not interpreted), a Triton
    that has it."""
    if INTERPRETED or device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return False
    from triton.language.extra import cuda

    return hasattr(cuda, "gdc_wait") and hasattr(cuda, "gdc_launch_dependents")


@triton.jit
def _residual_linear_kernel(x_ptr, w_ptr, residual_ptr, out_ptr, stats_ptr, part_ptr, count_ptr, M, x_stride,
                            N: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, SPLITS: tl.constexpr, K_SPLIT: tl.constexpr,
                            UPCAST: tl.constexpr, USE_PDL: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                            WRITE_STATS: tl.constexpr):
    # one program per (tile of BLOCK_M rows, tile of BLOCK_N output columns, K range): out = residual + x @ W.T
    # (x @ W.T without HAS_RESIDUAL; residual_ptr is not read); WRITE_STATS: each output row's sum of squares over
    # the tile's columns into stats [M, column tiles]
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_ok = rows < M
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < N
    k_begin = tl.program_id(2) * K_SPLIT
    prefetch_weights(w_ptr, n, n_ok, k_begin, K, K_SPLIT, BLOCK_K, USE_PDL)  # the weights do not wait for x
    wait_previous(USE_PDL)
    acc = linear_dots(x_ptr, rows, rows_ok, x_stride, w_ptr, n, n_ok, k_begin, K, K_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K,
                      UPCAST)
    release_next(USE_PDL)
    acc, last = reduce_one(part_ptr, count_ptr, acc, rows, rows_ok, n, n_ok, M, N, SPLITS, BLOCK_M, BLOCK_N)
    if last:
        offs = rows[:, None] * N + n[None, :]
        ok = rows_ok[:, None] & n_ok[None, :]
        out = to_dtype(acc, w_ptr.dtype.element_ty).to(tl.float32)
        if HAS_RESIDUAL:
            out += tl.load(residual_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        stored = to_dtype(out, out_ptr.dtype.element_ty)
        tl.store(out_ptr + offs, stored, mask=ok)
        if WRITE_STATS:
            store_row_stats(stats_ptr, stored.to(tl.float32), rows, rows_ok, ok)


@triton.jit
def _norm_gate_up_kernel(x_ptr, stats_ptr, norm_ptr, w_ptr, out_ptr, part_ptr, count_ptr, M, x_stride, eps,
                         INTER: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, SPLITS: tl.constexpr, K_SPLIT: tl.constexpr,
                         STAT_TILES: tl.constexpr, UPCAST: tl.constexpr, USE_PDL: tl.constexpr):
    # one program per (tile of rows, tile of BLOCK_N of the INTER columns, K range): W rows n (gate) and INTER + n
    # (up); partials [SPLITS, M, 2 INTER]: gate at n, up at INTER + n. STAT_TILES: gemm_loop.row_scale's
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_ok = rows < M
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < INTER
    k_begin = tl.program_id(2) * K_SPLIT
    prefetch_weights(w_ptr, n, n_ok, k_begin, K, K_SPLIT, BLOCK_K, USE_PDL)
    prefetch_weights(w_ptr, n + INTER, n_ok, k_begin, K, K_SPLIT, BLOCK_K, USE_PDL)
    wait_previous(USE_PDL)
    w_dtype = w_ptr.dtype.element_ty
    scale = row_scale(x_ptr, stats_ptr, rows, rows_ok, x_stride, eps, K, BLOCK_M, BLOCK_K, STAT_TILES)
    gate, up = normed_pair_dots(x_ptr, rows, rows_ok, x_stride, scale, norm_ptr, w_ptr, n, n + INTER, n_ok,
                                k_begin, K, K_SPLIT, BLOCK_M, BLOCK_N, BLOCK_K, UPCAST)
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
                    pdl: bool = False, workspace: SplitWorkspace | None = None, splits: int | None = None,
                    stats: torch.Tensor | None = None) -> torch.Tensor:
    """residual + x @ weight.T: x [M, K], weight [N, K], residual [M, N] -> [M, N] in residual's dtype.
    tile, splits: None for tile_for(weight) and split_k's choice (tests and benchmarks pass others); workspace:
    the split-K scratch to reuse (None: one for this call); stats: a `stats_buffer` to receive the output rows'
    sums of squares, which the next norm_gate_up / norm_qkv_rope reads instead of recomputing them."""
    _check_linear("residual_linear", x, weight)
    if residual.shape != (x.shape[0], weight.shape[0]) or not residual.is_contiguous():
        raise ValueError(f"residual_linear: residual must be a contiguous [{x.shape[0]}, {weight.shape[0]}], "
                         f"got {tuple(residual.shape)}")
    chosen = tile or tile_for(weight)
    if stats is not None and stats.shape != (x.shape[0], triton.cdiv(weight.shape[0], chosen.block_n)):
        raise ValueError(f"stats: must be stats_buffer's [{x.shape[0]}, column tiles], got {tuple(stats.shape)}")
    out = torch.empty_like(residual)
    _linear_into(x, weight, residual, out, chosen, pdl, workspace, splits, stats)
    return out


def linear(x: torch.Tensor, weight: torch.Tensor, tile: Tile | None = None, workspace: SplitWorkspace | None = None,
           splits: int | None = None) -> torch.Tensor:
    """x @ weight.T: x [M, K], weight [N, K] -> [M, N] float32 (the product rounded to weight's dtype, as cuBLAS
    returns it). Row-invariant where cuBLAS is not (it picks kernels, split-K among them, by M): the engine's heads
    on CUDA (Embed.head_gemm)."""
    _check_linear("linear", x, weight)
    out = x.new_empty(x.shape[0], weight.shape[0], dtype=torch.float32)
    _linear_into(x, weight, None, out, tile or tile_for(weight), False, workspace, splits, None)
    return out


def stats_buffer(m: int, weight: torch.Tensor, tile: Tile | None = None) -> torch.Tensor:
    """[m, column tiles] fp32 for residual_linear(..., weight, stats=) to fill: one sum of squares per output row
    and column tile of `tile` (tile_for(weight) when None)."""
    block_n = (tile or tile_for(weight)).block_n
    return torch.empty(m, triton.cdiv(weight.shape[0], block_n), dtype=torch.float32, device=weight.device)


def _linear_into(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None, out: torch.Tensor, tile: Tile,
                 pdl: bool, workspace: SplitWorkspace | None, splits: int | None, stats: torch.Tensor | None) -> None:
    n, k = weight.shape

    def launch(grid: tuple[int, int, int], rows: slice, partials: torch.Tensor, counters: torch.Tensor,
               split: Split) -> None:
        _residual_linear_kernel[grid](
            x[rows], weight, out[rows] if residual is None else residual[rows], out[rows],
            partials if stats is None else stats[rows], partials, counters, rows.stop - rows.start, x.stride(0),
            N=n, K=k, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, SPLITS=split.splits,
            K_SPLIT=split.k_split, UPCAST=upcast(weight), USE_PDL=pdl, HAS_RESIDUAL=residual is not None,
            WRITE_STATS=stats is not None, **options(tile, pdl))

    launch_split(x.shape[0], n, n, k, tile.blocks, workspace, splits, x.device, launch)


def norm_gate_up(x: torch.Tensor, norm_weight: torch.Tensor, gate_up: torch.Tensor, eps: float,
                 tile: Tile | None = None, pdl: bool = False, workspace: SplitWorkspace | None = None,
                 splits: int | None = None, stats: torch.Tensor | None = None) -> torch.Tensor:
    """SiLU(gate) * up of RMSNorm(x): x [M, K], norm_weight [K], gate_up [2I, K] (gate rows, then up) -> [M, I]
    in x's dtype. stats: what residual_linear(..., stats=) left when it wrote x (None: computed from x here)."""
    _check_linear("norm_gate_up", x, gate_up)
    if gate_up.shape[0] % 2 or norm_weight.shape != x.shape[1:]:
        raise ValueError(f"norm_gate_up: need gate_up [2I, {x.shape[1]}] and norm_weight [{x.shape[1]}], got "
                         f"{tuple(gate_up.shape)} and {tuple(norm_weight.shape)}")
    check_stats(x, stats)
    inter, k = gate_up.shape[0] // 2, x.shape[1]
    out, chosen = x.new_empty(x.shape[0], inter), tile or tile_for(gate_up)

    def launch(grid: tuple[int, int, int], rows: slice, partials: torch.Tensor, counters: torch.Tensor,
               split: Split) -> None:
        _norm_gate_up_kernel[grid](
            x[rows], partials if stats is None else stats[rows], norm_weight, gate_up, out[rows], partials, counters,
            rows.stop - rows.start, x.stride(0), eps, INTER=inter, K=k, BLOCK_M=chosen.block_m,
            BLOCK_N=chosen.block_n, BLOCK_K=chosen.block_k, SPLITS=split.splits, K_SPLIT=split.k_split,
            STAT_TILES=0 if stats is None else stats.shape[1], UPCAST=upcast(gate_up), USE_PDL=pdl,
            **options(chosen, pdl))

    launch_split(x.shape[0], inter, 2 * inter, k, chosen.blocks, workspace, splits, x.device, launch)
    return out


def check_stats(x: torch.Tensor, stats: torch.Tensor | None) -> None:
    if stats is not None and (stats.dim() != 2 or stats.shape[0] != x.shape[0] or stats.dtype != torch.float32
                              or not stats.is_contiguous()):
        raise ValueError(f"stats: must be a contiguous float32 [{x.shape[0]}, column tiles] (stats_buffer), got "
                         f"{tuple(stats.shape)} {stats.dtype}")


def upcast(weight: torch.Tensor) -> bool:
    """Products in fp32 through tl.dot: fp32 weights (no TF32), and always in the interpreter."""
    return weight.dtype == torch.float32 or INTERPRETED


def _check_linear(name: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"{name}: x must be [M, K] and the weight [N, K], got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    if x.stride(1) != 1 or not weight.is_contiguous():
        raise ValueError(f"{name}: x's rows and the weight must be contiguous")
