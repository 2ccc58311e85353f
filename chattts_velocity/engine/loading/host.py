"""The precision of a load on this host: the user's choices plus what this machine's kernels can do.

In: dtype ("auto" or a precision name), kv_cache_dtype, decode_dtype, device (None: CUDA when there is one), decode
backend. Out: the one `Precision` (its device included) that every stage of the load reads; nothing decides again.
"""
from __future__ import annotations

import torch

from chattts_velocity.model import kernels
from chattts_velocity.precision import Precision


def decide_here(dtype: str = "float32", kv_cache_dtype: str = "auto", decode_dtype: str | None = None,
                device: str | torch.device | None = None, backend: str = "auto") -> Precision:
    """Precision.decide with this host's facts: whether our C++ CPU kernels run (read by "auto") and whether the
    CPU computes bf16 natively (read by the audio decode's default)."""
    return Precision.decide(dtype, kv_cache_dtype, decode_dtype, device, backend,
                            cpu_kernels=kernels.unsupported() is None, cpu_bf16=kernels.native_bf16())
