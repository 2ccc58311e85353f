"""Engine stage: the KV pool as the decode backends see it, and one step's integer inputs as tensors.

In: a ScheduledBatch (or, for tests, positions and block tables as lists). Out: StepTensors (positions, slots, the
block tables of the batch), built once per step on the host side with a few tensor ops; each backend derives the
metadata its kernels read from them (worker/backends/select.py). Block tables live in a persistent buffer (BlockTables):
a step writes only the entries a sequence gained since its last step.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from chattts_velocity.engine.sched.decode_batch import DecodeBatch
from chattts_velocity.engine.sched.sequence import Sequence, SequenceStatus
from chattts_velocity.engine.sched.step import ScheduledBatch
from chattts_velocity.model import AttentionMetadata, DecodeMetadata
from chattts_velocity.model.llama import KVPair


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`; to CUDA through pinned memory without blocking the host (no stream sync)."""
    if device.type != "cuda" or tensor.is_cuda:
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


@dataclass(frozen=True)
class PagedKV:
    """The engine's KV pool as the backends see it."""

    pairs: list[KVPair]  # per layer (K, V), each [num_blocks + 1, block_size, heads, head_dim (+ 4 if int8)]
    block_size: int
    pad_block: int  # the extra last block, never handed out: write target of padding rows in compiled steps
    device: torch.device


@dataclass
class StepTensors:
    """One step's integer inputs on the pool's device. Sequence b computes positions k_lens[b] - q_lens[b] ..
    k_lens[b] - 1; its new rows are packed sequence after sequence (N = sum(q_lens))."""

    q_lens: list[int]  # [B]
    k_lens: list[int]  # [B]
    positions: torch.Tensor  # [N] int64
    slots: torch.Tensor  # [N] int64, pool slot each new row's K/V goes to
    block_tables: torch.Tensor  # [B, w] int64, w >= every sequence's block count; entries past a context: any block
    seq_of_row: torch.Tensor | None  # [N] int64, the sequence of each row; None in decode steps (row b = sequence b)
    prompt_lens: list[int] | None = None  # [B] prompt positions of each sequence (rows past them were generated)

    @property
    def decode_only(self) -> bool:
        return self.seq_of_row is None

    @property
    def num_seqs(self) -> int:
        return len(self.q_lens)

    def last_indices(self) -> torch.Tensor:
        """[B] the row of each sequence's last new position (the one that samples), on the host."""
        return torch.tensor(self.q_lens).cumsum(0) - 1

    def row_metadata(self, rows: torch.Tensor | None = None) -> DecodeMetadata:
        """Every new row (or only `rows` [G], indices on the device) as a decode row of its own (slot, its
        sequence's table, context = position + 1)."""
        slots, positions = (self.slots, self.positions) if rows is None else (self.slots[rows], self.positions[rows])
        if self.seq_of_row is None:
            tables = self.block_tables if rows is None else self.block_tables[rows]
        else:
            tables = self.block_tables[self.seq_of_row if rows is None else self.seq_of_row[rows]]
        return DecodeMetadata(slots, tables, positions + 1)

    @classmethod
    def build(cls, q_lens: list[int], k_lens: list[int], block_tables: torch.Tensor, block_size: int,
              ) -> StepTensors:
        """From the step's lengths and its block tables [B, w] (on the device)."""
        device = block_tables.device
        if all(q == 1 for q in q_lens):
            positions = to_device(torch.tensor(k_lens, dtype=torch.int64) - 1, device)
            seq_of_row, table_rows = None, block_tables
        else:
            q_t, k_t = torch.tensor(q_lens), torch.tensor(k_lens)
            seq = torch.repeat_interleave(torch.arange(len(q_lens)), q_t, output_size=sum(q_lens))  # [N]
            starts = (torch.cumsum(q_t, 0) - q_t)[seq]
            host_positions = (k_t - q_t)[seq] + torch.arange(seq.shape[0]) - starts
            positions, seq_of_row = (to_device(t, device) for t in (host_positions, seq))
            table_rows = block_tables[seq_of_row]
        blocks = table_rows.gather(1, (positions // block_size).unsqueeze(1)).squeeze(1)
        return cls(list(q_lens), list(k_lens), positions, blocks * block_size + positions % block_size, block_tables,
                   seq_of_row)

    @classmethod
    def decode(cls, positions: torch.Tensor, k_lens: list[int], block_tables: torch.Tensor, block_size: int,
               ) -> StepTensors:
        """A decode step from its positions [B] and block tables [B, w], both on the device already."""
        blocks = block_tables.gather(1, (positions // block_size).unsqueeze(1)).squeeze(1)
        return cls([1] * len(k_lens), k_lens, positions, blocks * block_size + positions % block_size, block_tables,
                   None)

    @classmethod
    def from_lists(cls, q_lens: list[int], k_lens: list[int], tables: list[list[int]], block_size: int,
                   device: torch.device) -> StepTensors:
        """For callers holding plain lists (tests, benchmarks): tables padded with block 0."""
        width = max(len(t) for t in tables)
        padded = torch.tensor([list(t) + [0] * (width - len(t)) for t in tables], dtype=torch.int64)
        return cls.build(q_lens, k_lens, padded.to(device), block_size)

    @classmethod
    def from_attention_metadata(cls, meta: AttentionMetadata, block_size: int) -> StepTensors:
        return cls.build(meta.q_lens, meta.k_lens, meta.block_tables.long().clamp(min=0), block_size)


class BlockTables:
    """The block tables of running sequences in one persistent [rows, width] int64 tensor on the pool's device.

    A sequence keeps its row while it runs; a step writes only the entries appended to its block table since the
    last step (one small host-to-device copy for all of them), and a table the block manager replaced (preemption,
    a new allocation) is rewritten whole. Rows of sequences no longer running are reused.
    """

    def __init__(self, num_rows: int, width: int, device: torch.device) -> None:
        self.table = torch.zeros(num_rows, width, dtype=torch.int64, device=device)
        self.device = device
        self._row: dict[int, int] = {}  # id(seq) -> row
        self._seq: list[Sequence | None] = [None] * num_rows
        self._source: list[list[int] | None] = [None] * num_rows  # the list object each row mirrors
        self._written = [0] * num_rows
        self._free = list(range(num_rows - 1, -1, -1))
        self._steady: tuple[DecodeBatch, torch.Tensor] | None = None  # a persistent batch and its rows [B]
        self._steady_view: torch.Tensor | None = None  # its rows' first columns, as the last step read them

    def rows(self, batch: ScheduledBatch) -> torch.Tensor:
        """Bring the batch's rows up to date -> block tables [B, w] (w: the widest table of the batch)."""
        index = to_device(torch.tensor(self._sync(batch.seqs), dtype=torch.int64), self.device)
        width = max(len(seq.block_table) for seq in batch.seqs)
        return self.table[index, :width]

    def steady_rows(self, state: DecodeBatch, ahead: int = 0) -> torch.Tensor:
        """rows() of a persistent batch, kept in a copy of its own [B, width]: its first step syncs every row, a
        later one writes only the last block of each slot that gained one (state.grown) -> block tables [B, w]
        (wide enough for a step `ahead` of the host's tokens)."""
        if self._steady is None or self._steady[0] is not state:
            index = to_device(torch.tensor(self._sync(state.seqs), dtype=torch.int64), self.device)
            self._steady = (state, self.table[index])
            self._steady_view = None
        elif len(state.grown):
            slots = state.grown.tolist()
            tables = [state.seqs[b].block_table for b in slots]
            writes = torch.tensor([slots, [len(t) - 1 for t in tables], [t[-1] for t in tables]], dtype=torch.int64)
            writes = to_device(writes, self.device)
            self._steady[1].index_put_((writes[0], writes[1]), writes[2])
        width = -(-(state.max_length + ahead) // state.block_size)
        if self._steady_view is None or self._steady_view.shape[1] != width:  # a view per width, not per step
            self._steady_view = self._steady[1][:, :width]
        return self._steady_view

    def _sync(self, seqs: list[Sequence]) -> list[int]:
        """Write the entries the sequences' tables gained since they were last written -> their rows."""
        index: list[int] = []
        rows: list[int] = []
        cols: list[int] = []
        values: list[int] = []
        for seq in seqs:
            row = self._row.get(id(seq))
            if row is None or self._seq[row] is not seq:
                row = self._assign(seq)
            table = seq.block_table
            if self._source[row] is not table:
                self._source[row], self._written[row] = table, 0
            done, n = self._written[row], len(table)
            if n > done:
                rows += [row] * (n - done)
                cols += range(done, n)
                values += table[done:]
                self._written[row] = n
            index.append(row)
        if values:
            writes = to_device(torch.tensor([rows, cols, values], dtype=torch.int64), self.device)
            self.table.index_put_((writes[0], writes[1]), writes[2])
        return index

    def _assign(self, seq: Sequence) -> int:
        if not self._free:
            self._release_stale()
        row = self._free.pop()
        self._row[id(seq)], self._seq[row], self._source[row], self._written[row] = row, seq, None, 0
        return row

    def _release_stale(self) -> None:
        for row, seq in enumerate(self._seq):
            if seq is not None and seq.status is not SequenceStatus.RUNNING:
                del self._row[id(seq)]
                self._seq[row] = self._source[row] = None
                self._free.append(row)
        if not self._free:
            raise RuntimeError("BlockTables: every row belongs to a running sequence; size it above max_num_seqs")


def step_tensors(batch: ScheduledBatch, tables: BlockTables, block_size: int) -> StepTensors:
    """The step's integer inputs: lengths from the batch, block tables from the persistent buffer."""
    q_lens = batch.num_new_tokens
    k_lens = [done + new for done, new in zip(batch.num_computed_tokens, q_lens, strict=True)]
    step = StepTensors.build(q_lens, k_lens, tables.rows(batch), block_size)
    if not batch.is_decode_only:  # some row is a prompt row, or one of several new rows
        step.prompt_lens = [seq.num_prompt_tokens for seq in batch.seqs]
    return step


def padded_decode(st: StepTensors, kv: PagedKV, size: int, width: int,
                  ) -> tuple[torch.Tensor, DecodeMetadata]:
    """A decode step's positions [size] and DecodeMetadata with `size` rows and `width` table columns: the real
    rows first, then padding rows at position 0 of the pad block (they write their K/V there and attend only to it).
    Table columns past a sequence's own blocks hold the pad block too: never a block of another sequence.
    """
    num, pad, real = st.num_seqs, size - st.num_seqs, min(width, st.block_tables.shape[1])
    tables = torch.full((size, width), kv.pad_block, dtype=torch.int64, device=st.positions.device)
    tables[:num, :real] = st.block_tables[:, :real]
    positions = torch.cat([st.positions, st.positions.new_zeros(pad)])
    slots = torch.cat([st.slots, st.slots.new_full((pad,), kv.pad_block * kv.block_size)])
    return positions, DecodeMetadata(slots, tables, positions + 1)
