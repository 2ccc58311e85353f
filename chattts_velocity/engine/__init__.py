"""Engine stage: Prompt + SamplingParams -> GenerationOutput (scheduler, KV blocks, sampler, model runner)."""
from __future__ import annotations

from chattts_velocity.engine.core.block_manager import BlockManager
from chattts_velocity.engine.core.scheduler import Scheduler
from chattts_velocity.engine.core.sequence import Sequence, SequenceStatus
from chattts_velocity.engine.core.step import ScheduledBatch, StepOutput
from chattts_velocity.engine.sampling.sampler import Sampler, SamplingBatch

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
