"""Model stage, CUDA backend: RMSNorm (plain and fused with the residual add) and RoPE in Triton.

Rows in, rows out, with the roundings of model/layers.py: RMSNorm's statistics in fp32, the normalised row cast
back to the input dtype before the weight multiply (HF order); RoPE in the NeoX rotate-half layout,
out = x * cos + rotate_half(x) * sin with cos/sin tables [max_positions, head_dim] (both halves stored), each
product and the sum rounded to x's dtype as torch's eager ops do.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from chattts_velocity.model.kernels.triton.rounding import to_dtype

EAGER = {"enable_fp_fusion": False}  # no fused multiply-adds: each product is rounded, as in torch's eager ops


@triton.jit
def _round(x, DTYPE: tl.constexpr):
    # an fp32 value rounded to DTYPE and back: one eager torch op's result in DTYPE
    return to_dtype(x, DTYPE).to(tl.float32)


@triton.jit
def _rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, x_stride, residual_stride, eps,
                     HIDDEN: tl.constexpr, BLOCK: tl.constexpr, ADD_RESIDUAL: tl.constexpr):
    # one program per row of HIDDEN values
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < HIDDEN
    x = tl.load(x_ptr + row * x_stride + offs, mask=ok, other=0.0)
    if ADD_RESIDUAL:  # residual + x, rounded to the rows' dtype like torch's add, is also the new residual
        residual = tl.load(residual_ptr + row * residual_stride + offs, mask=ok, other=0.0)
        x = to_dtype(x.to(tl.float32) + residual.to(tl.float32), x_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * HIDDEN + offs, x, mask=ok)
    xf = x.to(tl.float32)
    variance = tl.sum(xf * xf, 0) / HIDDEN
    normed = _round(xf * tl.rsqrt(variance + eps), x_ptr.dtype.element_ty)
    weight = tl.load(weight_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * HIDDEN + offs, to_dtype(weight * normed, out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _rope_kernel(x_ptr, out_ptr, positions_ptr, cos_ptr, sin_ptr, row_stride, head_stride, table_stride,
                 HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    # one program per row: every head of it; first half j and second half j + HALF rotate together
    row = tl.program_id(0).to(tl.int64)
    dtype = x_ptr.dtype.element_ty
    position = tl.load(positions_ptr + row).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    j = tl.arange(0, BLOCK_HALF)[None, :]
    ok = (h < HEADS) & (j < HALF)
    table = position * table_stride + j
    cos1 = _round(tl.load(cos_ptr + table, mask=j < HALF, other=0.0), dtype)
    cos2 = _round(tl.load(cos_ptr + table + HALF, mask=j < HALF, other=0.0), dtype)
    sin1 = _round(tl.load(sin_ptr + table, mask=j < HALF, other=0.0), dtype)
    sin2 = _round(tl.load(sin_ptr + table + HALF, mask=j < HALF, other=0.0), dtype)
    x_offs = row * row_stride + h * head_stride + j
    x1 = tl.load(x_ptr + x_offs, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + x_offs + HALF, mask=ok, other=0.0).to(tl.float32)
    # rotate_half(x) = cat(-x2, x1)
    out1 = _round(x1 * cos1, dtype) - _round(x2 * sin1, dtype)
    out2 = _round(x2 * cos2, dtype) + _round(x1 * sin2, dtype)
    out_offs = row * (HEADS * 2 * HALF) + h * (2 * HALF) + j
    tl.store(out_ptr + out_offs, to_dtype(out1, dtype), mask=ok)
    tl.store(out_ptr + out_offs + HALF, to_dtype(out2, dtype), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of x [N, H] with weight [H] -> [N, H] in promote_types(weight, x), as layers.RMSNorm."""
    _check_rows("rms_norm", x, weight)
    x = _row_major(x)
    out = x.new_empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype))
    _launch_norm(x, x, weight, out, out, eps, add_residual=False)
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(residual + x), residual + x) for x, residual [N, H] of one dtype; the sum is the next residual."""
    _check_rows("fused_add_rms_norm", x, weight)
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"fused_add_rms_norm: residual must match x {tuple(x.shape)} {x.dtype}, "
                         f"got {tuple(residual.shape)} {residual.dtype}")
    x, residual = _row_major(x), _row_major(residual)
    out = x.new_empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype))
    new_residual = torch.empty_like(x, memory_format=torch.contiguous_format)
    _launch_norm(x, residual, weight, out, new_residual, eps, add_residual=True)
    return out, new_residual


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """RotaryEmbedding.forward: q [N, heads, D], k [N, kv_heads, D], positions [N] int -> rotated (q, k), new tensors.

    cos_cache, sin_cache: [max_positions, D] (RotaryEmbedding's buffers), cast to q/k's dtype as there.
    """
    if cos_cache.dim() != 2 or cos_cache.shape != sin_cache.shape or cos_cache.shape[1] % 2:
        raise ValueError(f"cos_cache, sin_cache: need two [max_positions, even head_dim] tables, "
                         f"got {tuple(cos_cache.shape)} and {tuple(sin_cache.shape)}")
    for name, x in (("q", q), ("k", k)):
        if x.dim() != 3 or x.shape[0] != positions.shape[0] or x.shape[2] != cos_cache.shape[1]:
            raise ValueError(f"apply_rope: {name} must be [{positions.shape[0]}, heads, {cos_cache.shape[1]}] "
                             f"(one row per position), got {tuple(x.shape)}")
    cos_cache, sin_cache = cos_cache.contiguous(), sin_cache.contiguous()
    return _rope(q, positions, cos_cache, sin_cache), _rope(k, positions, cos_cache, sin_cache)


def _rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    if x.stride(2) != 1:
        x = x.contiguous()
    out = x.new_empty(x.shape)
    heads, half = x.shape[1], x.shape[2] // 2
    _rope_kernel[(x.shape[0],)](x, out, positions, cos, sin, x.stride(0), x.stride(1), cos.stride(0),
                                HEADS=heads, HALF=half, BLOCK_H=triton.next_power_of_2(heads),
                                BLOCK_HALF=triton.next_power_of_2(half), **EAGER)
    return out


def _launch_norm(x, residual, weight, out, residual_out, eps: float, add_residual: bool) -> None:
    hidden = x.shape[1]
    _rms_norm_kernel[(x.shape[0],)](x, residual, weight.contiguous(), out, residual_out, x.stride(0),
                                    residual.stride(0), eps, HIDDEN=hidden, BLOCK=triton.next_power_of_2(hidden),
                                    ADD_RESIDUAL=add_residual, **EAGER)


def _check_rows(name: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    if x.dim() != 2 or weight.shape != x.shape[1:]:
        raise ValueError(f"{name}: x must be [N, H] and weight [H], got {tuple(x.shape)} and {tuple(weight.shape)}")


def _row_major(x: torch.Tensor) -> torch.Tensor:
    # rows may be strided (a view into a wider tensor); each row's values must be contiguous
    return x if x.stride(1) == 1 else x.contiguous()
