"""Engine backend "cpu": one fused C++ op per layer (model/fused.py, model/kernels/)."""
from __future__ import annotations

import torch

from chattts_velocity.engine.worker.sampling.sampler import Sampler
from chattts_velocity.engine.worker.step_inputs import PagedKV, StepTensors
from chattts_velocity.model import ChatTTSLlama, FusedDecoder, fused_unavailable
from chattts_velocity.precision import Precision


class CpuBackend:
    """Every step runs one fused C++ op per layer (bf16 and int8 engines on CPUs where the kernels build); nothing
    is compiled. A general step's rows go through the op as rows of their own positions, so a position gets the
    same bits in a prefill chunk, a decode step or a recompute after preemption, in any batch (the seed contract).
    """

    name = "cpu"

    def __init__(self, model: ChatTTSLlama, kv: PagedKV) -> None:
        self.model, self.kv, self.sampler = model, kv, Sampler()
        self.fused = FusedDecoder(model)

    def run(self, embeds: torch.Tensor, step: StepTensors) -> torch.Tensor:
        # a general step's rows are decode rows of their own positions (each with its sequence's table)
        return self.fused(embeds, step.positions, self.kv.pairs, step.row_metadata())


def cpu_unavailable(model: ChatTTSLlama, precision: Precision) -> str | None:
    """Why the cpu backend cannot run this engine, or None when it can."""
    if precision.kv_cache not in (torch.bfloat16, torch.int8):
        return (f"its fused C++ layers need a bfloat16 KV cache (dtype 'bfloat16' or 'int8') or an int8 one "
                f"(kv_cache_dtype 'int8'), this one is {precision.kv_cache}")
    return fused_unavailable(model)


