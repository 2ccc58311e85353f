"""Engine stage: the host a step ahead — a steady decode step launched before the previous one's tokens are read.

In: a launched steady step's tokens [B, rows] and hidden states [B, H] on the device. Out: InFlight, whose tokens reach
the host through double-buffered staging (pinned on CUDA, plain tensors elsewhere) behind an event, read by
Readback.finish once the next step is launched. LLMEngine drives it (EngineConfig.overlap, decided once by the model
runner): while the persistent batch stays, step n+1 is scheduled and launched (its input ids are step n's tokens,
already on the device; its counters one step past the host's) before step n's tokens are read; a sequence that ends
with step n is seen one step late, its row of step n+1 discarded, its blocks held until step n+1 completes
(BlockManager.hold). Anything that may change the batch drains the pipeline: the next step runs synchronously.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from chattts_velocity.engine.sched.step import ScheduledBatch


@dataclass
class InFlight:
    """A launched step whose tokens the host has not read."""

    batch: ScheduledBatch
    tokens: torch.Tensor  # [B, rows] int64 on the host (staging): valid once `copied` has passed
    hidden: torch.Tensor  # [B, H] fp32 on the device
    copied: Any  # the CUDA event recorded after the copy; None off CUDA (the copy is done)
    start: float = field(default_factory=time.perf_counter)


class Readback:
    """Device-to-host copies of sampled tokens into two staging buffers used in turn. A buffer is written again two
    launches later, after the host read the step it held (finish() comes before the next launch but one)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.buffers: list[torch.Tensor | None] = [None, None]
        self.views: list[torch.Tensor | None] = [None, None]  # each buffer's last [B, rows] view (kept: a step's shape
        # stays while the batch does)
        self.turn = 0

    def start(self, batch: ScheduledBatch, tokens: torch.Tensor, hidden: torch.Tensor) -> InFlight:
        """Queue the copy of tokens [B, rows] behind the step that samples them (no wait)."""
        turn = self.turn
        self.turn ^= 1
        host = self.views[turn]
        if host is None or host.shape != tokens.shape:
            host = self.views[turn] = self._view(turn, tokens.shape)
        host.copy_(tokens, non_blocking=self.cuda)
        copied = None
        if self.cuda:
            copied = torch.cuda.Event()  # type: ignore[no-untyped-call]  # unannotated in torch
            copied.record()
        return InFlight(batch, host, hidden, copied)

    def _view(self, turn: int, shape: torch.Size) -> torch.Tensor:
        n, buffer = shape.numel(), self.buffers[turn]
        if buffer is None or buffer.numel() < n:
            buffer = self.buffers[turn] = torch.empty(max(n, 64), dtype=torch.int64, pin_memory=self.cuda)
        return buffer[:n].view(shape)

    @staticmethod
    def finish(step: InFlight) -> torch.Tensor:
        """Wait for the step's tokens -> [B, rows] on the host (a copy: the staging buffer is reused)."""
        if step.copied is not None:
            step.copied.synchronize()
        return step.tokens.clone()
