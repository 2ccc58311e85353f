"""Engine stage: the persistent decode batch — per-slot state of a steady set of decoding sequences, as arrays.

In: the sequences of a decode-only step (built once, when the running set changes). Out: what a steady decode step
needs without a per-sequence Python loop: lengths, generated counts, finish limits, seed keys, the repetition-penalty
history, the last sampled tokens. The scheduler (engine/sched/scheduler.py) builds one whenever a decode-only batch
is eligible and reuses it while no sequence is admitted, finishes, is preempted or aborted; the model runner and
the sampler read it; the scheduler advances it after each step. A steady step's tokens and hidden states go to the
batch's log, not to the sequences: sync() hands them on (the scheduler calls it before anything reads or changes a
sequence: a finish, an abort, a general step), so every slow path sees the sequences as the synchronous loop leaves
them.
"""
from __future__ import annotations

import numpy as np
import torch

from chattts_velocity.engine.sched.sequence import LoggedHidden, Sequence

MASK64 = (1 << 64) - 1
EMPTY = np.empty(0, dtype=np.int64)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 of every element of a uint64 array (wrapping arithmetic, as engine/worker/sampling/sampler.py's)."""
    # NOTE: numpy wraps uint64 array arithmetic silently (only scalar overflow warns)
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    mixed: np.ndarray = x ^ (x >> np.uint64(31))
    return mixed


def eligible(seqs: list[Sequence]) -> bool:
    """A batch the steady path serves: plain code-mode decodes, no beams, no custom processors."""
    return bool(seqs) and all(
        not seq.is_beam and not seq.is_text and not seq.params.logits_processors and seq.seed is not None
        and seq.num_computed_tokens == len(seq) - 1 and seq.num_rows == seq.num_vq
        for seq in seqs)


class DecodeBatch:
    """Slot b is seqs[b]; arrays [B] unless noted. Valid while the running set does not change."""

    def __init__(self, seqs: list[Sequence], block_size: int) -> None:
        self.seqs = list(seqs)
        self.block_size = block_size
        self.request_ids = [seq.request_id for seq in seqs]
        self.rows = seqs[0].num_rows
        params = [seq.params for seq in seqs]
        self.lengths = np.array([len(seq) for seq in seqs], dtype=np.int64)  # positions, the newest included
        self.generated = np.array([seq.num_generated for seq in seqs], dtype=np.int64)
        self.last_step = np.array([p.max_new_token - 1 for p in params], dtype=np.int64)  # generated count ending
        self.min_new = np.array([p.min_new_token for p in params], dtype=np.int64)
        self.eos = np.array([p.eos_token_id for p in params], dtype=np.int64)
        # mypy silenced below: eligible() checked that every seed is set
        seeds = np.array([seq.seed & MASK64 for seq in seqs], dtype=np.uint64)  # type: ignore[operator]
        self.seed_keys = splitmix64(seeds)
        self.windows = np.array([max(p.penalty_window, 0) for p in params], dtype=np.int64)
        self.history = self._history()  # [B, rows, W] ring of the last `window` ids, -1 = empty
        self.ring_slots = np.flatnonzero(self.windows > 0)  # the slots that keep a history
        same = len(self.ring_slots) == len(seqs) and bool((self.windows == self.windows[0]).all())
        self.one_window = int(self.windows[0]) if same else 0  # every slot's window, when they are all one
        self.max_length = int(self.lengths.max())
        self.no_eos_mask = torch.zeros(len(seqs) * self.rows, dtype=torch.bool)  # [B * rows] no slot masks EOS
        keeps = np.array([p.return_hidden for p in params], dtype=bool)
        self.keeps_hidden = None if keeps.all() else keeps  # [B] bool; None: every slot keeps its hidden states
        self.any_hidden = bool(keeps.any())
        self.log = np.empty((16, len(seqs), self.rows), dtype=np.int64)  # [T, B, rows] tokens of the steps run
        self.log_hidden: list[torch.Tensor] = []  # [t] of [B, H]: the hidden states of the steps not synced yet
        self.synced = 0  # steps of the log the sequences hold (rows and hidden states)
        self.rows_synced = np.zeros(len(seqs), dtype=np.int64)  # [B] steps whose rows slot b's sequence holds
        self.last_tokens = torch.tensor([seq.last_row for seq in seqs], dtype=torch.int64)  # [B, num_vq]
        self.grown = EMPTY  # slots whose block table gained a block for this step
        self.ended = EMPTY  # slots that ended with the last step
        self.steps = 0  # steady steps run on this batch
        self.length_end = int((self.last_step - self.generated).min())  # the step where a slot reaches its length
        self.table: StepTable | None = None
        self._row = 0
        for b, seq in enumerate(seqs):
            seq.log, seq.log_slot = self, b  # a sequence read meanwhile takes the logged steps first (Sequence._pull)

    def __len__(self) -> int:
        return len(self.seqs)

    def _history(self) -> np.ndarray:
        width = int(self.windows.max(initial=0))
        ring = np.full((len(self.seqs), self.rows, width), -1, dtype=np.int64)
        for b, seq in enumerate(self.seqs):
            window, count = int(self.windows[b]), min(seq.num_generated, int(self.windows[b]))
            if not count:
                continue
            recent = np.frombuffer(seq.generated_flat, dtype=np.int64)[-count * self.rows:].reshape(count, self.rows)
            steps = np.arange(seq.num_generated - count, seq.num_generated)
            ring[b, :, steps % window] = recent
        return ring

    def noise_seeds(self, ahead: int = 0) -> np.ndarray:
        """[B] uint64 step_seed(seed, num_generated + ahead) of every slot (worker/sampling/sampler.step_seed): the
        step after the last appended one, or `ahead` steps past it (a step launched before its predecessor's
        tokens are read, engine/worker/overlap.py)."""
        seeds: np.ndarray = self._table(ahead).seeds[self._row]
        return seeds

    def new_blocks(self, ahead: int = 0) -> np.ndarray:
        """Slots whose newest position (len - 1 + ahead) opens a block: they need one more block this step."""
        table = self._table(ahead)
        return np.flatnonzero(table.opens[self._row]) if table.any_opens[self._row] else EMPTY

    def positions(self, ahead: int = 0) -> np.ndarray:
        """[B] the position each slot feeds (len - 1 + ahead)."""
        positions: np.ndarray = self._table(ahead).positions[self._row]
        return positions

    def ring_columns(self, ahead: int, scratch: int) -> np.ndarray:
        """[B] the penalty-ring column of the token a step feeds as its input (generated count - 1 + ahead, modulo
        the slot's window), `scratch` where it goes to no ring (no window, or a prompt row)."""
        table = self._table(ahead)
        columns = table.columns[self._row]
        return np.where(columns < 0, scratch, columns)

    def below_min(self, ahead: int = 0) -> np.ndarray | None:
        """[B] bool: the slots that must not sample EOS yet (generated + ahead < min_new_token); None: none."""
        table = self._table(ahead)
        return table.below[self._row] if table.any_below[self._row] else None

    def filled_blocks(self) -> np.ndarray | None:
        """[B] bool: the slots whose newest position (the one the step after the last appended one feeds) is the
        last of its block; None: none."""
        table = self._table(0)
        return table.fills[self._row] if table.any_fills[self._row] else None

    def ends_by_length(self) -> bool:
        """True when a slot reaches max_new_token with the step after the last appended one."""
        return self.steps >= self.length_end

    def step_row(self, ahead: int = 0) -> tuple[StepTable, int]:
        """The table holding step `steps + ahead` and that step's row in it."""
        table = self._table(ahead)
        return table, self._row

    def _table(self, ahead: int) -> StepTable:
        """The tabulated values of step `steps + ahead` (self._row its row), built STEPS_TABULATED steps at a time:
        the counters move by one a step, so a step reads rows instead of computing them."""
        step = self.steps + ahead
        table = self.table
        if table is None or not table.first <= step < table.first + STEPS_TABULATED:
            # from the host's step: one table serves the step in flight and the one ahead of it
            table = self.table = StepTable(self, self.steps)
        self._row = step - table.first
        return table

    def finished(self, tokens: np.ndarray) -> np.ndarray:
        """[B] bool: the slots that end with this step's tokens [B, rows] (EOS in any row, or max_new_token)."""
        ends: np.ndarray = (tokens == self.eos[:, None]).any(1)
        return ends | (self.generated >= self.last_step) if self.ends_by_length() else ends

    def advance(self, tokens: np.ndarray, hidden: torch.Tensor | None) -> None:
        """Every slot sampled tokens [B, rows] (and hidden [B, H]): they go to the log; lengths, counts and the
        penalty ring move one step."""
        if self.steps == len(self.log):
            self.log = np.concatenate([self.log, np.empty_like(self.log)])
        self.log[self.steps] = tokens
        if self.any_hidden and hidden is not None:
            self.log_hidden.append(hidden)
        if self.one_window:
            self.history[self.ring_slots, :, self.generated % self.one_window] = tokens
        elif len(self.ring_slots):
            live = self.ring_slots
            self.history[live, :, self.generated[live] % self.windows[live]] = tokens[live]
        self.lengths += 1
        self.max_length += 1
        self.generated += 1
        self.steps += 1

    @property
    def pending(self) -> bool:
        """Steps in the log that the sequences do not hold yet."""
        return self.synced < self.steps

    def rows_behind(self, slot: int) -> bool:
        """Slot `slot`'s sequence lacks rows of the log."""
        return bool(self.rows_synced[slot] < self.steps)

    def sync(self, drop_last: np.ndarray | None = None) -> None:
        """Hand the logged rows and hidden states to the sequences (and their computed positions); where
        drop_last[b], slot b's last row stays out (it ends with it: its own finish rules append it)."""
        start, end = self.synced, self.steps  # the hidden states of steps [start, end) (rows: from rows_synced)
        if start == end:
            return
        self.synced = end
        per_slot = np.ascontiguousarray(self.log[start:end].transpose(1, 0, 2))  # [B, t, rows]
        hidden = self.log_hidden if len(self.log_hidden) == end - start else None  # None: not every step kept them
        self.log_hidden = []  # (the sequences keep the step tensors; nothing is copied)
        drop = [False] * len(self.seqs) if drop_last is None else drop_last.tolist()
        for b, (seq, short, first) in enumerate(zip(self.seqs, drop, self.rows_synced.tolist(), strict=True)):
            count = end - start - short
            kept = None if hidden is None else LoggedHidden(hidden, b, count)
            seq.extend_rows(per_slot[b, first - start: count], kept)
        self.rows_synced[:] = end

    def sync_rows(self, slots: np.ndarray) -> None:
        """Only the rows of these slots reach their sequences (their filled blocks go to the prefix cache now);
        the hidden states wait for sync()."""
        for b in slots.tolist():
            rows = np.ascontiguousarray(self.log[self.rows_synced[b]: self.steps, b])  # [t, rows]
            self.seqs[b].extend_rows(rows, None)
            self.rows_synced[b] = self.steps


STEPS_TABULATED = 32


class StepTable:
    """Per-step values of STEPS_TABULATED consecutive steps of a batch, from step `first` (its steps run when built) on;
    arrays [K, B]."""

    def __init__(self, state: DecodeBatch, first: int) -> None:
        self.first = first
        offsets = np.arange(STEPS_TABULATED)[:, None] + (first - state.steps)  # [K, 1] steps past the counters
        generated = state.generated + offsets  # [K, B] the count before each step
        self.positions = state.lengths - 1 + offsets
        self.seeds = splitmix64(state.seed_keys ^ generated.astype(np.uint64))
        previous = generated - 1  # the count of the token each step feeds, -1: a prompt row
        windows = np.maximum(state.windows, 1)
        self.columns = np.where((previous >= 0) & (state.windows > 0), previous % windows, -1)  # -1: no ring
        self.opens = self.positions % state.block_size == 0
        self.any_opens: np.ndarray = self.opens.any(1)
        self.fills = (self.positions + 1) % state.block_size == 0
        self.any_fills: np.ndarray = self.fills.any(1)
        self.below: np.ndarray = np.less(generated, state.min_new)
        self.any_below: np.ndarray = self.below.any(1)
