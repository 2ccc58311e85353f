"""Model stage, CUDA backend: Triton kernels for the paged Llama and device-side sampling.

The decode layer's five kernels: qkv.py (RMSNorm -> q|k|v -> RoPE -> KV store), decode_attention.py (paged
decode attention, batch-invariant splits), gemm.py (o / down projection + residual, RMSNorm -> gate|up -> SiLU x up);
prefill_attention.py (varlen prefill attention), norm.py (the final RMSNorm), embedding.py (a decode step's code
embeddings, slots and context lengths), sampling.py (temperature + repetition penalty, top-p/top-k, EOS mask,
counter-based Exp(1) noise and the draw). Each op takes the tensors the torch paths of
model/attention.py, model/layers.py and engine/ take, and returns the same values up to float rounding; the tests
compare them on small shapes.

Import the submodules only when `available()` is None. Without a GPU they run in Triton's CPU interpreter, on
CPU tensors, when TRITON_INTERPRET=1 was set before `triton` itself was imported: triton reads it when
`@triton.jit` decorates a function, and its own library (tl.zeros, tl.sum, ...) is decorated at its import.
"""
from __future__ import annotations

import importlib.util
import os
import sys

import torch


def available() -> str | None:
    """None when the kernels can run here, else the reason they cannot."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install triton)"
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if not interpret:
        return None if torch.cuda.is_available() else "no CUDA device, and TRITON_INTERPRET is not 1 (CPU interpreter)"
    if _compiled_library():
        return "TRITON_INTERPRET=1 was set after triton was imported (set it before anything imports triton)"
    return None


def _compiled_library() -> bool:
    """True when triton.language was decorated for compilation, so the interpreter cannot run it."""
    language = sys.modules.get("triton.language")
    if language is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return not isinstance(language.zeros, InterpretedFunction)
