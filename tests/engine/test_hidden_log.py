"""engine/worker/hidden_log.py: each step's hidden states get fresh memory; consecutive steps stack without a copy."""
from __future__ import annotations

import torch

from chattts_velocity.engine.worker.hidden_log import SEGMENT_STEPS, HiddenLog, runs, slot_rows


def stacked(steps: list[torch.Tensor]) -> torch.Tensor:
    """[N, T, H]: the runs side by side (one run: the view itself)."""
    pieces = runs(steps)
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, 1)


def fill(log: HiddenLog, steps: int, num: int) -> list[torch.Tensor]:
    rows = []
    for k in range(steps):
        row = log.next_rows(num)
        row.copy_(torch.randn(num, log.hidden_size) + k)
        rows.append(row)
    return rows


def test_rows_are_never_handed_out_twice_across_segments() -> None:
    log = HiddenLog(8, torch.device("cpu"))
    rows = fill(log, 2 * SEGMENT_STEPS + 3, 5) + fill(log, 4, 3)  # a new batch size starts a new segment
    starts = [row.data_ptr() for row in rows]
    assert len(set(starts)) == len(rows)
    saved = [row.clone() for row in rows]
    fill(log, SEGMENT_STEPS, 3)  # later steps leave the earlier rows as they were
    assert all(torch.equal(row, copy) for row, copy in zip(rows, saved, strict=True))


def test_consecutive_rows_stack_as_a_view_and_others_as_a_copy() -> None:
    log = HiddenLog(8, torch.device("cpu"))
    rows = fill(log, 10, 4)
    view = stacked(rows[2:9])
    assert torch.equal(view, torch.stack(rows[2:9], 1)) and view.shape == (4, 7, 8)
    assert view.data_ptr() == rows[2].data_ptr()  # no copy
    gap = stacked([rows[1], rows[3]])  # not consecutive: a copy with the same values
    assert torch.equal(gap, torch.stack([rows[1], rows[3]], 1)) and gap.data_ptr() != rows[1].data_ptr()
    across = fill(log, SEGMENT_STEPS, 4)  # rows of two segments: a copy
    both = stacked(rows + across)
    assert torch.equal(both, torch.stack(rows + across, 1))
    plain = [torch.randn(4, 8) for _ in range(3)]  # tensors of their own
    assert torch.equal(stacked(plain), torch.stack(plain, 1))
    skewed = [torch.randn(8, 4).t() for _ in range(2)]  # non-contiguous steps: copied
    assert torch.equal(stacked(skewed), torch.stack(skewed, 1))


def test_rows_handed_out_in_inference_mode_still_stack_as_a_view() -> None:
    log = HiddenLog(8, torch.device("cpu"))
    with torch.inference_mode():  # as the engine's launch runs: views there keep no view bookkeeping
        rows = fill(log, 6, 3)
    view = stacked(rows)
    assert view.data_ptr() == rows[0].data_ptr() and torch.equal(view, torch.stack(rows, 1))


def test_runs_split_at_segment_ends_and_slot_rows_follow_them() -> None:
    log = HiddenLog(8, torch.device("cpu"))
    rows = fill(log, SEGMENT_STEPS + 10, 4)  # one full segment, then 10 rows of the next
    plain = [torch.randn(4, 8), torch.randn(4, 8)]
    steps = rows[:5] + plain + rows[5:]
    pieces = runs(steps)
    assert [p.shape[1] for p in pieces] == [5, 1, 1, SEGMENT_STEPS - 5, 10]
    assert [p.data_ptr() for p in pieces[3:]] == [rows[5].data_ptr(), rows[SEGMENT_STEPS].data_ptr()]  # views
    whole = torch.stack(steps, 1)
    assert torch.equal(torch.cat(pieces, 1), whole)
    for count in (0, 6, len(steps) - 1, len(steps)):
        parts = slot_rows(pieces, 3, count)
        joined = torch.cat(parts) if parts else torch.zeros(0, 8)
        assert torch.equal(joined, whole[3, :count])
