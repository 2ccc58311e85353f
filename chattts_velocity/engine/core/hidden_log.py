"""Engine stage: the hidden states of consecutive steady steps, side by side in one block of memory.

A steady step's last hidden states [N, H] leave the step graph's output buffer (the next replay overwrites it) by a
copy into the next row of a segment [SEGMENT_STEPS, N, H]. A segment row is written once, so the views that the
persistent batch's log and the consumers keep stay valid, and `stacked` turns the rows of consecutive steps into one
[N, T, H] view instead of a copy (a consumer's log reaching its requests when the batch changes copies nothing).
"""
from __future__ import annotations

import torch

SEGMENT_STEPS = 32


class HiddenLog:
    """Hands out fresh [N, H] rows of segments, one row per step."""

    def __init__(self, hidden_size: int, device: torch.device) -> None:
        self.hidden_size, self.device = hidden_size, device
        self.segment: torch.Tensor | None = None  # [SEGMENT_STEPS, N, H] float32
        self.used = 0

    def next_rows(self, num: int) -> torch.Tensor:
        """[num, H] float32, never handed out before."""
        segment = self.segment
        if segment is None or self.used == SEGMENT_STEPS or segment.shape[1] != num:
            segment = self.segment = torch.empty(SEGMENT_STEPS, num, self.hidden_size, device=self.device)
            self.used = 0
        self.used += 1
        return segment[self.used - 1]


def stacked(steps: list[torch.Tensor]) -> torch.Tensor:
    """[N, T, H] from steps [T] of [N, H]: a view where they are consecutive rows of one segment, else a copy."""
    base = steps[0]._base
    if base is not None and base.dim() == 3 and base.shape[1:] == steps[0].shape:
        start, stride = steps[0].storage_offset(), base.stride(0)
        if all(step._base is base and step.storage_offset() == start + k * stride for k, step in enumerate(steps)):
            first = (start - base.storage_offset()) // stride
            return base[first: first + len(steps)].transpose(0, 1)
    return torch.stack(steps, 1)
