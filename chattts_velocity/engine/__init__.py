"""Engine stage: Prompt + SamplingParams -> GenerationOutput (scheduler, KV blocks, sampler, model runner)."""
from __future__ import annotations

from chattts_velocity.engine.block_manager import BlockManager
from chattts_velocity.engine.sampler import Sampler, SamplingBatch
from chattts_velocity.engine.scheduler import Scheduler
from chattts_velocity.engine.sequence import Sequence, SequenceStatus
from chattts_velocity.engine.step import ScheduledBatch, StepOutput

__all__ = [
    "BlockManager",
    "Sampler",
    "SamplingBatch",
    "ScheduledBatch",
    "Scheduler",
    "Sequence",
    "SequenceStatus",
    "StepOutput",
]
