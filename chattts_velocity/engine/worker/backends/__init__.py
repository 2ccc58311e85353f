"""Engine: the decode backends — what runs the paged Llama for a step, chosen once per engine (select.py).

In: embeddings of the new positions [N, H] and the step's integer inputs (StepTensors: positions, slots, block
tables, built once per step by the model runner). Out: hidden states [N, H] after the final norm. Each backend
derives from them the metadata its own kernels read (only the torch backends build an attention mask), and owns
its sampler. The scheduler, block manager and sequences never see which backend runs; the model runner calls `run`.

| backend | a decode step | general steps |
|---|---|---|
| TorchBackend ("torch", torch_backend.py) | eager layers, SDPA over gathered blocks | eager layers |
| CompiledTorchBackend ("torch.compile", torch_backend.py) | a compiled layer graph (C++ attention on bf16) | eager |
| CpuBackend ("cpu", cpu_backend.py) | one fused C++ op per layer (model/fused.py) | the same op, a row per position |
| TritonBackend ("triton", triton_backend.py) | Triton kernels per layer, CUDA graphs on CUDA | Triton kernels |
"""
from __future__ import annotations

from typing import Protocol

import torch

from chattts_velocity.engine.worker.sampling.sampler import Sampler
from chattts_velocity.engine.worker.step_inputs import PagedKV, StepTensors


class DecodeBackend(Protocol):
    kv: PagedKV  # the paged KV pools the backend's layers read and write

    @property
    def name(self) -> str:
        """"torch", "torch.compile", "cpu" or "triton": reported in LLMEngine.metrics()."""

    @property
    def sampler(self) -> Sampler:
        """The one sampler of the engine (the triton backend's samples on the device)."""

    def run(self, embeds: torch.Tensor, step: StepTensors) -> torch.Tensor:
        """One step (decode, prefill chunks, recompute, mixed): embeds [N, H] -> hidden [N, H]."""
