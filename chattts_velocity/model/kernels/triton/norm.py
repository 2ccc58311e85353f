"""Model stage, CUDA backend: RMSNorm in Triton (the final norm; the layers' norms are fused into their GEMMs).

Rows in, rows out, with the roundings of model/layers.py: statistics in fp32, the normalised row cast back to the
input dtype before the weight multiply (HF order); each product rounded as torch's eager ops round it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from chattts_velocity.model.kernels.triton.rounding import to_dtype

EAGER = {"enable_fp_fusion": False}  # no fused multiply-adds: each product is rounded, as in torch's eager ops


@triton.jit
def _rms_norm_kernel(x_ptr, weight_ptr, out_ptr, x_stride, eps, HIDDEN: tl.constexpr, BLOCK: tl.constexpr):
    # one program per row of HIDDEN values, rounded to promote_types(weight, x), stored in out's dtype (as wide)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < HIDDEN
    x = tl.load(x_ptr + row * x_stride + offs, mask=ok, other=0.0).to(tl.float32)
    variance = tl.sum(x * x, 0) / HIDDEN
    normed = to_dtype(x * tl.rsqrt(variance + eps), x_ptr.dtype.element_ty).to(tl.float32)
    weight = tl.load(weight_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    y = weight * normed
    if x_ptr.dtype.element_ty == weight_ptr.dtype.element_ty:  # else one of them is fp32, and so is the result
        y = to_dtype(y, x_ptr.dtype.element_ty)
    tl.store(out_ptr + row * HIDDEN + offs, y.to(out_ptr.dtype.element_ty), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of x [N, H] with weight [H] -> [N, H] in promote_types(weight, x), as layers.RMSNorm; with out
    [N, H] (contiguous, at least as wide), that result written there (`.float()` folded into the launch)."""
    if x.dim() != 2 or weight.shape != x.shape[1:]:
        raise ValueError(f"rms_norm: x must be [N, H] and weight [H], got {tuple(x.shape)} and {tuple(weight.shape)}")
    x = x if x.stride(1) == 1 else x.contiguous()  # rows may be strided; each row's values must be contiguous
    dtype = torch.promote_types(weight.dtype, x.dtype)
    if out is None:
        out = x.new_empty(x.shape, dtype=dtype)
    elif out.shape != x.shape or not out.is_contiguous() or torch.promote_types(out.dtype, dtype) != out.dtype:
        raise ValueError(f"rms_norm: out must be [{x.shape[0]}, {x.shape[1]}] contiguous, {dtype} or wider, got "
                         f"{tuple(out.shape)} {out.dtype}")
    hidden = x.shape[1]
    _rms_norm_kernel[(x.shape[0],)](x, weight.contiguous(), out, x.stride(0), eps, HIDDEN=hidden,
                                    BLOCK=triton.next_power_of_2(hidden), **EAGER)
    return out
