"""BlockManager invariants over thousands of random allocate/compute/append/fork/free operations.

A simulated KV store checks what matters end to end: every position a sequence reads through its
block table holds the value that sequence's own prefix would have written (so prefix sharing,
forks and block reuse never hand out wrong or stale KV).
"""
from __future__ import annotations

import hashlib
import random
from collections import Counter

import torch
from fakes import make_prompt
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from chattts_velocity.engine.sched.block_manager import BlockManager
from chattts_velocity.engine.sched.sequence import Sequence
from chattts_velocity.schema import SamplingParams

SPEAKERS = [None, torch.ones(4), torch.full((4,), 2.0)]


class Pool:
    """A BlockManager, the live sequences and a fake KV store written through block tables."""

    def __init__(self, num_blocks: int, block_size: int, caching: bool) -> None:
        self.bm = BlockManager(num_blocks, block_size, caching)
        self.seqs: list[Sequence] = []
        self.kv: dict[tuple[int, int], bytes] = {}
        self.count = 0

    def _kv_value(self, seq: Sequence, pos: int) -> bytes:
        ids, mask = seq.rows(0, pos + 1)
        return hashlib.blake2b(ids.numpy().tobytes() + mask.numpy().tobytes() + seq.cache_salt).digest()

    def _slot(self, seq: Sequence, pos: int) -> tuple[int, int]:
        return seq.block_table[pos // self.bm.block_size], pos % self.bm.block_size

    def new_seq(self, length: int, variant: int, speaker: int, group: int = 0) -> Sequence:
        """group > 0: a beam of seat group `g{group}` (blocks kept for it are its own)."""
        self.count += 1
        seq = Sequence(f"s{self.count}", make_prompt(length, seed=variant, spk=SPEAKERS[speaker]),
                       SamplingParams(seed=0))
        seq.seat_group = (f"g{group}", 2) if group else None
        return seq

    def allocate(self, seq: Sequence) -> None:
        if self.bm.can_allocate(seq):
            self.bm.allocate(seq)
            self.seqs.append(seq)

    def compute(self, seq: Sequence, num: int) -> None:
        """Write KV for up to `num` pending positions (never past len-1... i.e. len(seq))."""
        end = min(len(seq), seq.num_computed_tokens + num)
        for pos in range(seq.num_computed_tokens):  # reads: cached or earlier-computed KV
            assert self.kv[self._slot(seq, pos)] == self._kv_value(seq, pos), (seq, pos)
        for pos in range(seq.num_computed_tokens, end):
            self.kv[self._slot(seq, pos)] = self._kv_value(seq, pos)
        seq.num_computed_tokens = end
        self.bm.cache_computed_blocks(seq)

    def append(self, seq: Sequence, token: int) -> None:
        if seq.num_computed_tokens < len(seq):
            return  # still prefilling
        if self.bm.can_append(self._appended(seq, token)):
            self.bm.append_slot(seq)
        else:
            seq.generated.pop()

    @staticmethod
    def _appended(seq: Sequence, token: int) -> Sequence:
        seq.append_token((token,) * 4, None)
        return seq

    def fork(self, parent: Sequence) -> None:
        child = Sequence(f"{parent.request_id}f", parent.prompt, parent.params)
        child.generated, child.seat_group = list(parent.generated), parent.seat_group
        if self.bm.can_fork(parent, child):
            self.bm.fork(parent, child)
            self.seqs.append(child)

    def free(self, seq: Sequence) -> None:
        self.bm.free(seq)
        self.seqs.remove(seq)

    def check(self) -> None:
        bm = self.bm
        assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
        assert bm.num_unreserved_blocks >= 0  # the free blocks cover every group's kept ones
        holders = Counter(b for seq in self.seqs for b in seq.block_table)
        assert all(bm.ref_counts[b] == holders.get(b, 0) for b in range(bm.num_blocks))
        free = list(bm._free)
        assert len(free) == len(set(free)) == bm.num_blocks - len(holders)
        assert all(bm.ref_counts[b] == 0 for b in free)
        for seq in self.seqs:
            assert len(seq.block_table) == seq.num_blocks(bm.block_size)
            assert len(set(seq.block_table)) == len(seq.block_table)
            assert seq.num_computed_tokens <= len(seq)
        for key, block in bm._cached.items():
            assert bm.block_hashes[block] == key

    def drain(self) -> None:
        for seq in list(self.seqs):
            self.free(seq)
        assert self.bm.num_used_blocks == 0 and all(r == 0 for r in self.bm.ref_counts)
        for group in ("g1", "g2"):
            self.bm.unreserve(group)
        assert self.bm.num_unreserved_blocks == self.bm.num_blocks


class BlockManagerMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(4, 24), block_size=st.sampled_from([1, 2, 4]), caching=st.booleans())
    def setup(self, num_blocks: int, block_size: int, caching: bool) -> None:
        self.pool = Pool(num_blocks, block_size, caching)

    @rule(length=st.integers(1, 12), variant=st.integers(0, 2), speaker=st.integers(0, 2), group=st.integers(0, 2))
    def allocate(self, length: int, variant: int, speaker: int, group: int) -> None:
        self.pool.allocate(self.pool.new_seq(length, variant, speaker, group))

    @rule(group=st.integers(1, 2), blocks=st.integers(0, 16))
    def reserve(self, group: int, blocks: int) -> None:
        self.pool.bm.reserve(f"g{group}", blocks)

    @rule(group=st.integers(1, 2))
    def unreserve(self, group: int) -> None:
        self.pool.bm.unreserve(f"g{group}")

    @precondition(lambda self: self.pool.seqs)
    @rule(pick=st.integers(0, 100), num=st.integers(1, 8))
    def compute(self, pick: int, num: int) -> None:
        self.pool.compute(self.pool.seqs[pick % len(self.pool.seqs)], num)

    @precondition(lambda self: self.pool.seqs)
    @rule(pick=st.integers(0, 100), token=st.integers(0, 3))
    def append(self, pick: int, token: int) -> None:
        self.pool.append(self.pool.seqs[pick % len(self.pool.seqs)], token)

    @precondition(lambda self: self.pool.seqs)
    @rule(pick=st.integers(0, 100))
    def fork(self, pick: int) -> None:
        self.pool.fork(self.pool.seqs[pick % len(self.pool.seqs)])

    @precondition(lambda self: self.pool.seqs)
    @rule(pick=st.integers(0, 100))
    def free(self, pick: int) -> None:
        self.pool.free(self.pool.seqs[pick % len(self.pool.seqs)])

    @invariant()
    def consistent(self) -> None:
        if hasattr(self, "pool"):
            self.pool.check()

    def teardown(self) -> None:
        if hasattr(self, "pool"):
            self.pool.drain()


BlockManagerMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=60, deadline=None)
TestBlockManagerMachine = BlockManagerMachine.TestCase


def test_random_operations_keep_invariants():
    """5,000 random operations with few distinct prompts, so prefix hits and evictions are frequent."""
    rng = random.Random(1234)
    for caching, block_size in [(True, 2), (True, 4), (False, 4)]:
        pool = Pool(12, block_size, caching)
        for _ in range(5_000 // 3):
            op = rng.random()
            if op < 0.25 or not pool.seqs:
                pool.allocate(pool.new_seq(rng.randint(1, 10), rng.randint(0, 1), rng.randint(0, 2), rng.randint(0, 2)))
            elif op < 0.28:
                pool.bm.reserve(f"g{rng.randint(1, 2)}", rng.randint(0, 8))
            elif op < 0.30:
                pool.bm.unreserve(f"g{rng.randint(1, 2)}")
            elif op < 0.55:
                pool.compute(rng.choice(pool.seqs), rng.randint(1, 6))
            elif op < 0.75:
                pool.append(rng.choice(pool.seqs), rng.randint(0, 1))
            elif op < 0.82:
                pool.fork(rng.choice(pool.seqs))
            else:
                pool.free(rng.choice(pool.seqs))
            pool.check()
        pool.drain()
