"""Engine stage: Prompt + SamplingParams -> GenerationOutput (scheduler, KV blocks, sampler, model runner)."""
from __future__ import annotations

from chattts_velocity.engine.sched.block_manager import BlockManager
from chattts_velocity.engine.sched.scheduler import Scheduler
from chattts_velocity.engine.sched.sequence import Sequence, SequenceStatus
from chattts_velocity.engine.sched.step import ScheduledBatch, StepOutput
from chattts_velocity.engine.worker.sampling.sampler import Sampler, SamplingBatch

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
