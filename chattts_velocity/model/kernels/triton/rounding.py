"""Model stage, CUDA backend: the one float conversion every Triton kernel here uses to write a narrower dtype.

NOTE: GPUs round fp32 -> bf16 to nearest even, but Triton's CPU interpreter truncates. Rounding the fp32 bits
ourselves first makes the final cast exact on both, so interpreter runs match torch's bf16 results bit for bit.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def to_dtype(x, DTYPE: tl.constexpr):
    # float x -> DTYPE, round to nearest even
    x = x.to(tl.float32)
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(DTYPE)
