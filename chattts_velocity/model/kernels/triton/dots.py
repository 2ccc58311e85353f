"""Model stage, CUDA backend: the one tile product every Triton kernel here accumulates (GEMMs, prefill scores)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dot(a, b, UPCAST: tl.constexpr):
    # a [BM, BK] @ b [BK, BN] -> fp32. UPCAST: fp32 operands (IEEE products, no TF32: fp32 weights or pools, as
    # torch) and the CPU interpreter, whose tl.dot multiplies bf16 bit patterns as integers; the operands are
    # already rounded to the dtype the product runs in
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out
