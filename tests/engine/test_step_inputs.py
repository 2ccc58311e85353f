"""engine/worker/step_inputs.py: the step's integer inputs as tensors, and the persistent block-table buffer."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity.devtools.sync_detector import SyncDetector
from chattts_velocity.engine.sched.sequence import Sequence, SequenceStatus
from chattts_velocity.engine.sched.step import ScheduledBatch
from chattts_velocity.engine.worker.step_inputs import BlockTables, StepTensors
from chattts_velocity.model import build_attention_metadata
from chattts_velocity.schema import Prompt, SamplingParams

CPU = torch.device("cpu")


def _seq(name: str, table: list[int]) -> Sequence:
    seq = Sequence(name, Prompt(torch.zeros(3, 4, dtype=torch.int64), torch.zeros(3, dtype=torch.bool)),
                   SamplingParams())
    seq.block_table, seq.status = table, SequenceStatus.RUNNING
    return seq


def _batch(*seqs: Sequence) -> ScheduledBatch:
    n = len(seqs)
    return ScheduledBatch(list(seqs), [1] * n, [0] * n, [False] * n, [True] * n)


def _writes(tables: BlockTables, batch: ScheduledBatch) -> tuple[torch.Tensor, int]:
    """The batch's tables and how many entries the call wrote (index_put_ calls counted by value)."""
    before = tables.table.clone()
    out = tables.rows(batch)
    return out, int((tables.table != before).sum())


def test_rows_are_written_once_then_only_the_blocks_a_sequence_gains() -> None:
    tables = BlockTables(4, 8, CPU)
    a, b = _seq("a", [3, 5]), _seq("b", [7])
    out, written = _writes(tables, _batch(a, b))
    assert out.tolist() == [[3, 5], [7, 0]] and written == 3
    a.block_table.append(9)  # the block manager appends in place
    out, written = _writes(tables, _batch(b, a))
    assert out.tolist() == [[7, 0, 0], [3, 5, 9]] and written == 1
    a.block_table = [11]  # preempted and re-allocated: a new list, rewritten whole
    out, _ = _writes(tables, _batch(a))
    assert out.tolist() == [[11]]


def test_rows_of_sequences_no_longer_running_are_reused() -> None:
    tables = BlockTables(2, 4, CPU)
    a, b = _seq("a", [1]), _seq("b", [2])
    tables.rows(_batch(a, b))
    a.status = SequenceStatus.FINISHED_EOS
    c = _seq("c", [3])
    assert tables.rows(_batch(b, c)).tolist() == [[2], [3]]
    d = _seq("d", [4])
    with pytest.raises(RuntimeError, match="every row belongs to a running sequence"):
        tables.rows(_batch(b, c, d))


def test_step_tensors_match_the_torch_metadata_and_never_sync() -> None:
    q_lens, k_lens, tables = [5, 1, 3], [5, 9, 20], [[4, 2], [0, 1, 6], [7, 3, 8, 5, 10]]
    meta = build_attention_metadata(q_lens, k_lens, tables, 4)
    with SyncDetector() as syncs:
        step = StepTensors.from_lists(q_lens, k_lens, tables, 4, CPU)
        rows = step.row_metadata()
    assert syncs.count == 0, syncs.ops
    assert torch.equal(step.positions, meta.positions) and torch.equal(step.slots, meta.slot_mapping)
    assert torch.equal(step.last_indices(), meta.last_indices)
    assert rows.context_lens.tolist() == (meta.positions + 1).tolist()
    assert rows.block_tables.shape == (9, 5)
    decode = StepTensors.from_lists([1, 1], [6, 1], [[3, 7], [9]], 4, CPU)
    assert decode.decode_only and decode.positions.tolist() == [5, 0] and decode.slots.tolist() == [29, 36]
