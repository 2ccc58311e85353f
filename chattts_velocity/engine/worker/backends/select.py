"""Engine backends: choosing one, once per engine (config.backend)."""
from __future__ import annotations

import logging

import torch

from chattts_velocity.config import EngineConfig
from chattts_velocity.engine.worker.backends import DecodeBackend
from chattts_velocity.engine.worker.backends.cpu_backend import CpuBackend, cpu_unavailable
from chattts_velocity.engine.worker.backends.torch_backend import CompiledTorchBackend, TorchBackend
from chattts_velocity.engine.worker.step_inputs import PagedKV
from chattts_velocity.model import ChatTTSLlama

logger = logging.getLogger("chattts_velocity")


def select_backend(config: EngineConfig, model: ChatTTSLlama, kv: PagedKV) -> DecodeBackend:
    """The backend config.backend asks for. "auto": triton on CUDA devices where it can run, else cpu where it can
    run, else torch (compiled if config.compile).

    NOTE: one branch per backend, no registry. Asking for a backend that cannot run is a ValueError saying why,
    never a silent fallback; "auto" on CUDA falls back to torch with one warning when the triton backend fails at
    load (a kernel compile or the CUDA graph capture). The triton module is imported only when it is chosen
    (importing it imports triton).
    """
    choice, act_dtype = config.backend, config.precision.activations
    if choice == "triton" or (choice == "auto" and kv.device.type == "cuda"):
        from chattts_velocity.engine.worker.backends.triton_backend import (
            TritonBackend,
            triton_unavailable,
        )

        reason = triton_unavailable(kv)
        if reason is None:
            try:
                return TritonBackend(model, kv, act_dtype, config.max_num_seqs, config.max_model_len)
            except Exception as exc:  # noqa: BLE001 -- a compile or capture failure at load: "auto" serves anyway
                if choice == "triton":
                    raise
                reason = f"its warm-up or CUDA graph capture failed ({type(exc).__name__}: {exc})"
                logger.warning("backend 'auto': the triton backend cannot run here: %s; using the torch backend",
                               reason)
        if choice == "triton":
            raise ValueError(f"backend: 'triton' cannot run here: {reason}; use backend='torch' or 'auto'")
    if choice in ("auto", "cpu"):
        reason = cpu_unavailable(model, config.precision)
        if reason is None:
            if config.compile:
                logger.info("decode steps run fused C++ layers: nothing to compile")
            return CpuBackend(model, kv)
        if choice == "cpu":
            raise ValueError(f"backend: 'cpu' cannot run here: {reason}; use backend='torch' or 'auto'")
        if config.precision.kv_cache == torch.int8:  # no other backend reads int8 pools
            raise ValueError(f"kv_cache_dtype: 'int8' needs the cpu backend, which cannot run here: {reason}")
    if config.compile:
        return CompiledTorchBackend(model, kv, act_dtype)
    return TorchBackend(model, kv)
