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


def runs(steps: list[torch.Tensor]) -> list[torch.Tensor]:
    """Steps [T] of [N, H] (T >= 1) as pieces [N, t_i, H] in order (sum of t_i = T): a view for each run of
    consecutive rows of one segment, a copy of each run of other tensors."""
    pieces, run = [], [steps[0]]
    for step in steps[1:]:
        if _follows(run[-1], step) or not (_is_row(run[-1]) or _is_row(step)):
            run.append(step)
        else:
            pieces.append(_piece(run))
            run = [step]
    pieces.append(_piece(run))
    return pieces


def stacked(steps: list[torch.Tensor]) -> torch.Tensor:
    """[N, T, H] from steps [T] of [N, H] (a view where they are consecutive rows of one segment)."""
    pieces = runs(steps)
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, 1)


def slot_rows(pieces: list[torch.Tensor], slot: int, count: int) -> list[torch.Tensor]:
    """Slot `slot`'s first `count` rows of pieces [N, t_i, H], as views [t, H] in order."""
    out = []
    for piece in pieces:
        take = min(count, piece.shape[1])
        if take:
            out.append(piece[slot, :take])
        count -= take
    return out


def _is_row(step: torch.Tensor) -> bool:
    base = step._base
    return base is not None and base.dim() == 3 and base.shape[1:] == step.shape and step.is_contiguous()


def _follows(row: torch.Tensor, after: torch.Tensor) -> bool:
    """Whether `after` is the segment row right after `row`."""
    base = row._base
    return (_is_row(row) and after._base is base and _is_row(after)
            and after.storage_offset() == row.storage_offset() + base.stride(0))  # type: ignore[union-attr]


def _piece(run: list[torch.Tensor]) -> torch.Tensor:
    """[N, t, H] of a run of consecutive segment rows (a view) or of other tensors (a copy)."""
    if not _is_row(run[0]):
        return torch.stack(run, 1)
    base = run[0]._base
    first = (run[0].storage_offset() - base.storage_offset()) // base.stride(0)  # type: ignore[union-attr]
    return base[first: first + len(run)].transpose(0, 1)  # type: ignore[index]
