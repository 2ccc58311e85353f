"""Engine stage: continuous batching (which sequences run this step, chunked prefill, preemption).

In: Sequences via add(); StepOutput from the model runner. Out: ScheduledBatch; finished Sequences.
"""
from __future__ import annotations

import bisect
import random

import numpy as np
import torch

from chattts_velocity.config import EngineConfig
from chattts_velocity.engine.sched.admission import admission_order, blocks_for_admission, check_fits, seats_in_use
from chattts_velocity.engine.sched.block_manager import BlockManager
from chattts_velocity.engine.sched.decode_batch import EMPTY, DecodeBatch, eligible
from chattts_velocity.engine.sched.sequence import Sequence, SequenceStatus
from chattts_velocity.engine.sched.step import ScheduledBatch, StepOutput


class Scheduler:
    """Owns the waiting and running queues and the BlockManager; the runner sees only ScheduledBatch."""

    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: list[Sequence] = []  # next to admit first
        self.running: list[Sequence] = []
        self._requests: dict[str, Sequence] = {}  # unfinished requests by id
        self._seeds = random.Random(config.seed)  # seeds unseeded requests, so an engine replays
        self.num_preemptions = 0  # total over the scheduler's life (for metrics)
        # the persistent decode batch of the last decode-only step; reused until the running set changes
        self.steady: DecodeBatch | None = None
        self.use_steady = True  # False: every step takes the per-sequence path (the oracle of the tests)
        self._changed = True  # a sequence was admitted, finished, preempted or aborted since the last schedule

    @property
    def changed(self) -> bool:
        """A sequence was admitted, finished, preempted or aborted since the last schedule."""
        return self._changed

    def _key(self, seq: Sequence) -> tuple[int, float]:
        """Lower runs first and is preempted last."""
        priority = seq.params.priority if self.config.scheduling == "priority" else 0
        return (priority, seq.arrival)

    def add(self, seq: Sequence) -> None:
        check_fits(seq, self.config, self.block_manager)
        if seq.request_id in self._requests:
            raise ValueError(f"request_id: {seq.request_id!r} is already running; use a unique id")
        if seq.seed is None:
            seq.seed = self._seeds.getrandbits(63)
        seq.status = SequenceStatus.WAITING
        self._requests[seq.request_id] = seq
        self._changed = True
        if self.config.scheduling == "priority":
            keys = [self._key(s) for s in self.waiting]
            self.waiting.insert(bisect.bisect_right(keys, self._key(seq)), seq)
        else:
            self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """Run a sequence that already holds its blocks (a beam forked by BlockManager.fork)."""
        if seq.request_id in self._requests:
            raise ValueError(f"request_id: {seq.request_id!r} is already running; use a unique id")
        seq.status = SequenceStatus.RUNNING
        self._requests[seq.request_id] = seq
        self.running.append(seq)
        self._changed = True

    def abort(self, request_id: str) -> bool:
        """Stop a waiting or running request and free its blocks. False if it is unknown or done."""
        seq = self._requests.pop(request_id, None)
        if seq is None:
            return False
        self._changed = True
        self._sync(self.steady)
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self._leave(seq)
        else:
            self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED_ABORTED
        return True

    def _leave(self, seq: Sequence) -> None:
        """seq stops running and frees its blocks; the last running sequence of a seat group ends its reservation."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        group = seq.seat_group
        if group is not None and not any(s.seat_group == group for s in self.running):
            self.block_manager.unreserve(group[0])

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        # NOTE on the scheduling invariant: there is no prefill or decode phase. Every sequence
        # has num_computed_tokens (KV in cache) and len(seq) (prompt rows + generated tokens);
        # a step computes up to len(seq) - num_computed_tokens positions of it, within the
        # token budget (max_num_batched_tokens) and max_num_seqs. Running sequences go first,
        # decodes before unfinished prefill chunks, then waiting ones are admitted in queue
        # order (no skipping). A running sequence always holds blocks for every position it
        # computes; when the pool cannot supply its next slot, the unscheduled running
        # sequence with the largest (priority, arrival) key is preempted by recompute: its
        # blocks are freed, num_computed_tokens drops to 0, generated tokens and hidden states
        # stay, and it goes back to the front of the queue. Its sampling noise is keyed by
        # (seed, step), so the recomputed run samples exactly what an unconstrained run would.
        steady = self._schedule_steady()
        if steady is not None:
            return steady
        self._sync(self.steady)
        budget = self.config.max_num_batched_tokens
        chosen: list[tuple[Sequence, int]] = []
        preempted = False
        order = sorted(self.running, key=lambda s: (len(s) - s.num_computed_tokens > 1, self._key(s)))
        scheduled: set[Sequence] = set()
        for seq in order:
            if seq.num_computed_tokens == len(seq):
                continue  # a beam waiting for its group's choice (engine/beams/velocity.py): nothing to compute
            if budget == 0 or len(chosen) == self.config.max_num_seqs:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            if not self._reserve_slot(seq, scheduled):
                preempted = True
                continue
            chosen.append((seq, min(len(seq) - seq.num_computed_tokens, budget)))
            scheduled.add(seq)
            budget -= chosen[-1][1]
        if not preempted:  # the pool is full: admitting now would only preempt again
            self._admit(chosen, budget)
        batch = self._batch(chosen)
        whole = self.use_steady and len(chosen) == len(self.running) and batch.is_decode_only and not self.waiting
        self.steady = batch.steady = (DecodeBatch(batch.seqs, self.block_manager.block_size)
                                      if whole and eligible(batch.seqs) else None)
        self._changed = False
        return batch

    def _schedule_steady(self) -> ScheduledBatch | None:
        """The step the loop above would schedule for an unchanged set of decoding sequences, from the persistent
        batch's arrays; None when it does not apply (anything changed, or the pool is short of blocks)."""
        unchanged = self.steady is not None and not self._changed and not self.waiting
        return self._steady_batch(self.steady, 0) if unchanged else None  # type: ignore[arg-type]  # not None

    def schedule_ahead(self, state: DecodeBatch) -> ScheduledBatch | None:
        """The steady step after the one in flight on `state`, before that one's tokens are read (its sequences are
        assumed to go on; one that ends with it is seen one step late). None when the batch may change: anything
        admitted, finished, aborted or waiting, a slot that reaches max_new_token with the step in flight, a pool
        short of blocks."""
        if state is not self.steady or self._changed or self.waiting or state.ends_by_length():
            return None
        return self._steady_batch(state, 1)

    def _steady_batch(self, state: DecodeBatch, ahead: int) -> ScheduledBatch | None:
        grow = state.new_blocks(ahead)
        if len(grow) > self.block_manager.num_unreserved_blocks:
            return None  # the loop in schedule() preempts
        for b in grow.tolist():
            self.block_manager.append_slot(state.seqs[b], ahead, int(state.lengths[b]))
        state.grown = grow
        n = len(state)
        return ScheduledBatch(seqs=state.seqs, num_new_tokens=[1] * n,
                              num_computed_tokens=(state.lengths - 1 + ahead).tolist(), is_prefill=[False] * n,
                              sample=[True] * n, steady=state, ahead=ahead)

    def _reserve_slot(self, seq: Sequence, scheduled: set[Sequence]) -> bool:
        """Get seq's next KV slot, preempting other unscheduled runners; False if seq itself went."""
        while not self.block_manager.can_append(seq):
            victim = max((s for s in self.running if s not in scheduled), key=self._key)
            self._preempt(victim)
            if victim is seq:
                return False
        self.block_manager.append_slot(seq)
        return True

    def _preempt(self, seq: Sequence) -> None:
        self._leave(seq)
        self._changed = True
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        if self.config.scheduling == "priority":
            keys = [self._key(s) for s in self.waiting]
            self.waiting.insert(bisect.bisect_left(keys, self._key(seq)), seq)
        else:
            self.waiting.insert(0, seq)

    def _admit(self, chosen: list[tuple[Sequence, int]], budget: int) -> None:
        # NOTE: a sequence takes one of max_num_seqs seats; a seat group (a beam request, whose forks join the
        # running set without admission) takes all its seats, and reserves the KV blocks its beams can hold at once
        # (admission.group_blocks), when its first sequence is admitted: the running set never outgrows
        # max_num_seqs, and a fork or a beam's next slot never waits for a block nor preempts anyone. Both are
        # held until none of the group's sequences runs. A group that cannot reserve waits, and so does the queue
        # behind it (no skipping).
        used, held = seats_in_use(self.running)
        for seq in admission_order(self.waiting, self.running, self.config):
            if budget <= 0:
                break
            group = seq.seat_group
            seats = 1 if group is None else 0 if group[0] in held else group[1]
            if (len(chosen) == self.config.max_num_seqs or used + seats > self.config.max_num_seqs
                    or not blocks_for_admission(seq, self.block_manager)):
                break
            used += seats
            if group is not None:
                held.add(group[0])
            self.waiting.remove(seq)
            self.block_manager.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            chosen.append((seq, min(len(seq) - seq.num_computed_tokens, budget)))
            budget -= chosen[-1][1]

    @staticmethod
    def _batch(chosen: list[tuple[Sequence, int]]) -> ScheduledBatch:
        seqs = [seq for seq, _ in chosen]
        new = [n for _, n in chosen]
        done = [seq.num_computed_tokens for seq in seqs]
        return ScheduledBatch(
            seqs=seqs,
            num_new_tokens=new,
            num_computed_tokens=done,
            is_prefill=[n > 1 or d < seq.num_prompt_tokens for seq, d, n in zip(seqs, done, new, strict=True)],
            sample=[d + n == len(seq) for seq, d, n in zip(seqs, done, new, strict=True)],
        )

    def postprocess(self, batch: ScheduledBatch, out: StepOutput) -> list[Sequence]:
        """Advance the KV counters, append sampled tokens, apply finish rules; returns finished seqs."""
        if batch.steady is not None and batch.steady is self.steady and not self._changed:
            return self._postprocess_steady(batch.steady, out)
        if list(out.sampled) != batch.sample:
            raise RuntimeError(f"StepOutput.sampled {out.sampled} != ScheduledBatch.sample {batch.sample}")
        self._sync(batch.steady)
        self._sync(self.steady)
        batch.steady = None  # the batch changed while the step ran: its deltas too come per sequence
        tokens = out.tokens.tolist() if any(batch.sample) else []
        hiddens = out.hidden.unbind(0) if out.hidden is not None else [None] * batch.num_seqs  # [H] views
        finished = []
        for b, seq in enumerate(batch.seqs):
            if seq.status is not SequenceStatus.RUNNING:
                continue  # aborted while the step ran
            seq.num_computed_tokens = batch.num_computed_tokens[b] + batch.num_new_tokens[b]
            self.block_manager.cache_computed_blocks(seq)
            if not batch.sample[b]:
                continue
            status = self._append(seq, tuple(tokens[b][: seq.num_rows]), hiddens[b])
            if status is not None:
                self._finish(seq, status)
                finished.append(seq)
        return finished

    def _postprocess_steady(self, state: DecodeBatch, out: StepOutput) -> list[Sequence]:
        """postprocess of a persistent batch: the step goes to its log; an ending slot takes the per-sequence rules."""
        tokens = out.tokens.numpy()  # [B, rows] int64
        done = state.finished(tokens)
        full = state.filled_blocks() if self.block_manager.enable_prefix_caching else None  # before advance()
        state.advance(tokens, out.hidden)
        state.ended = np.flatnonzero(done) if done.any() else EMPTY
        filled = EMPTY if full is None else np.flatnonzero(full & ~done)
        if len(state.ended):
            state.sync(done)
        elif len(filled):
            state.sync_rows(filled)  # only their rows, for the block hashes
        for b in filled.tolist():
            self.block_manager.cache_computed_blocks(state.seqs[b])
        finished = []
        for b in state.ended.tolist():
            seq = state.seqs[b]
            seq.num_computed_tokens = len(seq)  # the position fed this step is computed too
            self.block_manager.cache_computed_blocks(seq)
            status = self._append(seq, tuple(tokens[b].tolist()), out.hidden[b] if out.hidden is not None else None)
            if status is not None:
                self._finish(seq, status)
                finished.append(seq)
        return finished

    @staticmethod
    def _sync(state: DecodeBatch | None) -> None:
        if state is not None:  # its logged steps reach its sequences before anything reads or changes one of them
            state.sync()

    @staticmethod
    def _append(seq: Sequence, token: tuple[int, ...], hidden: torch.Tensor | None) -> SequenceStatus | None:
        """Finish rules (upstream's): EOS in any row (not appended), or max_new_token reached."""
        if seq.is_beam:
            return None  # its beam search chooses and appends the token (engine/beams/velocity.py)
        if seq.params.eos_token_id in token:  # the sampler masks EOS until min_new_token
            return SequenceStatus.FINISHED_EOS
        seq.append_token(token, hidden)
        if seq.num_generated >= seq.params.max_new_token:
            return SequenceStatus.FINISHED_LENGTH
        return None

    def _finish(self, seq: Sequence, status: SequenceStatus) -> None:
        self._changed = True
        self._leave(seq)
        self._requests.pop(seq.request_id, None)
        seq.status = status
