"""Engine stage: the hidden states of consecutive steady steps, side by side in one block of memory.

A steady step's last hidden states [N, H] leave the step graph's output buffer (the next replay overwrites it) by a
copy into the next row of a segment [SEGMENT_STEPS, N, H]. A segment row is written once, so the views that the
persistent batch's log and the consumers keep stay valid, and `runs` turns the rows of consecutive steps into one
[N, T, H] view instead of a copy (a consumer's log reaching its requests when the batch changes copies nothing).
Rows are recognised by where they lie (one storage, one row after the other), not by view bookkeeping, which
inference mode does not keep.
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


def runs(steps: list[torch.Tensor]) -> list[torch.Tensor]:
    """Steps [T] of [N, H] (T >= 1) as pieces [N, t_i, H] in order (sum of t_i = T): a view for each run of steps
    that lie one after the other in one storage (a segment's rows), a copy of a non-contiguous step."""
    pieces, start = [], 0
    for end in range(1, len(steps) + 1):
        if end < len(steps) and _next_to(steps[end - 1], steps[end]):
            continue
        pieces.append(_piece(steps[start:end]))
        start = end
    return pieces


def slot_rows(pieces: list[torch.Tensor], slot: int, count: int) -> list[torch.Tensor]:
    """Slot `slot`'s first `count` rows of pieces [N, t_i, H], as views [t, H] in order."""
    out = []
    for piece in pieces:
        take = min(count, piece.shape[1])
        if take:
            out.append(piece[slot, :take])
        count -= take
    return out


def _next_to(row: torch.Tensor, after: torch.Tensor) -> bool:
    """Whether `after` starts where `row` ends in the same storage (both contiguous, of one shape)."""
    return (after.shape == row.shape and row.is_contiguous() and after.is_contiguous()
            and after.storage_offset() == row.storage_offset() + row.numel()
            and after.untyped_storage().data_ptr() == row.untyped_storage().data_ptr())


def _piece(run: list[torch.Tensor]) -> torch.Tensor:
    """[N, t, H] of steps lying one after the other (a view of their storage), or of one non-contiguous step."""
    first = run[0]
    if not first.is_contiguous():
        return torch.stack(run, 1)
    num, width = first.shape
    return first.as_strided((num, len(run), width), (width, num * width, 1))
