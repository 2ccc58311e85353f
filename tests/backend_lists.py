"""A decode backend driven from plain lists (tests and benchmarks hold lists; backends take StepTensors)."""
from __future__ import annotations

import torch

from chattts_velocity.engine.worker.backends import DecodeBackend
from chattts_velocity.engine.worker.step_inputs import StepTensors
from chattts_velocity.model import AttentionMetadata


def forward(backend: DecodeBackend, embeds: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """Any step described by torch's attention metadata -> hidden [N, H]."""
    return backend.run(embeds, StepTensors.from_attention_metadata(meta, backend.kv.block_size))


def decode(backend: DecodeBackend, embeds: torch.Tensor, positions: list[int],
           tables: list[list[int]]) -> torch.Tensor:
    """One decode row per sequence at positions[b]; tables[b] holds at least the blocks of positions 0..positions[b]."""
    step = StepTensors.from_lists([1] * len(positions), [p + 1 for p in positions], tables, backend.kv.block_size,
                                   backend.kv.device)
    return backend.run(embeds, step)
