"""Engine stage: the two hand-offs of one step between the scheduler and the model runner.

Scheduler -> runner: ScheduledBatch (which positions of which sequences to compute). Runner -> scheduler:
StepOutput (the sampled tokens and the hidden states that predicted them).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from chattts_velocity.engine.core.decode_batch import DecodeBatch
from chattts_velocity.engine.core.sequence import Sequence


@dataclass
class ScheduledBatch:
    """One step's work. Sequence b computes positions [num_computed_tokens[b], +num_new_tokens[b])."""

    seqs: list[Sequence]  # [B]; blocks for every computed position are already in seq.block_table
    num_new_tokens: list[int]  # [B] positions to compute: a prefill chunk, or 1 for decode
    num_computed_tokens: list[int]  # [B] positions already in the KV cache (the chunk's start)
    # [B] False only for a plain decode: one generated position, whose ids are seq.last_row.
    # True for prompt chunks and for recomputing generated positions after a preemption.
    is_prefill: list[bool]
    sample: list[bool]  # [B] the chunk reaches len(seq): the last position's logits are sampled
    # the persistent decode batch this step runs on (a decode-only step of an eligible, whole running set), or None
    steady: DecodeBatch | None = None
    # 1: a steady step scheduled before the tokens of the one in flight were read (engine/core/overlap.py); its
    # positions, counters and blocks are one step past the sequences'
    ahead: int = 0

    @property
    def num_seqs(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def is_decode_only(self) -> bool:
        return not any(self.is_prefill)


@dataclass
class StepOutput:
    """What the model runner returns for a ScheduledBatch."""

    tokens: torch.Tensor  # [B, rows] int64; rows >= seqs[b].num_rows; row b is ignored unless sampled[b]
    hidden: torch.Tensor | None  # [B, H] last computed position's state (predicted tokens[b]); None: not kept
    sampled: list[bool]  # [B] equals ScheduledBatch.sample (False for a partial prefill chunk)
    failed: dict[int, Exception] = field(default_factory=dict)  # b -> why sequence b failed this step (only it)
