"""Engine stage: the KV block pool (block ids, ref counts, prefix cache, blocks kept for beam requests).

In: Sequences. Out: `seq.block_table` (the only thing the model runner reads), free/used counts.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

from chattts_velocity.engine.sched.sequence import Sequence


class BlockManager:
    """Hands out ids of one preallocated pool of `num_blocks` blocks of `block_size` positions."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"BlockManager: num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hashes: list[bytes | None] = [None] * num_blocks  # set once a block is full and computed
        # ref-0 blocks in eviction order (front first); they stay findable by hash until popped
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[bytes, int] = {}  # block hash -> block id holding that KV
        # while a step is in flight: freed tables it may still write, with the seat group each belonged to
        self._held: list[tuple[list[int], str | None]] | None = None
        # NOTE on reservations: a seat group (a beam request) holds a reservation from when its first sequence is
        # admitted until none of its sequences runs: `_kept[group]` free blocks that only its sequences may take.
        # Invariant: len(_free) >= sum(_kept.values()). Every block the group takes from the free list is charged
        # to it, every block of its that returns to the free list is credited back (up to `_cap[group]`, what it
        # reserved); everyone else takes only from the free blocks beyond all groups' kept ones. (A block of the
        # group's that another request also holds, through the prefix cache, is not credited when the group lets
        # go of it; should the group then run short, its sequence takes unreserved blocks or preempts, as anyone.)
        self._kept: dict[str, int] = {}
        self._cap: dict[str, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    @property
    def num_unreserved_blocks(self) -> int:
        """Free blocks that no seat group keeps: what a sequence outside any group may take."""
        return len(self._free) - sum(self._kept.values())

    def available_to(self, seq: Sequence) -> int:
        """Free blocks seq may take: the unreserved ones, and those its seat group keeps."""
        group = _group(seq)
        return self.num_unreserved_blocks + (self._kept.get(group, 0) if group is not None else 0)

    def reserve(self, group: str, blocks: int) -> bool:
        """Keep `blocks` free blocks for the seat group's sequences; False (nothing kept) if the unreserved ones are
        fewer. A group that already holds a reservation keeps it."""
        if group in self._kept:
            return True
        if blocks > self.num_unreserved_blocks:
            return False
        self._kept[group] = self._cap[group] = blocks
        return True

    def unreserve(self, group: str) -> None:
        """The group runs no sequence any more: the blocks kept for it are everyone's again."""
        self._kept.pop(group, None)
        self._cap.pop(group, None)

    def is_reserved(self, group: str) -> bool:
        return group in self._kept

    def blocks_for(self, num_positions: int) -> int:
        return (num_positions + self.block_size - 1) // self.block_size

    def can_allocate(self, seq: Sequence) -> bool:
        hits = self._cache_hits(seq)
        revived = sum(1 for b in hits if self.ref_counts[b] == 0)  # cached but free: leaves the free list
        return seq.num_blocks(self.block_size) - len(hits) + revived <= self.available_to(seq)

    def allocate(self, seq: Sequence) -> None:
        """Give a waiting sequence blocks for all len(seq) positions (prompt, plus generated on recompute)."""
        # NOTE on the prefix-cache invariant: a block is findable by hash only once it is FULL and
        # its KV has been COMPUTED (see cache_computed_blocks), so a hit never points at KV that
        # is still to be written. The hash of block i chains the hash of block i-1 with the
        # content of block i: all num_vq ids of every position, its text_mask bits, and the
        # sequence's cache_salt (speaker vector bytes + positions). Same ids with another speaker
        # or another audio-prompt code therefore never share KV. Hits are limited to blocks that
        # end at or before position len-2, so the last position is always recomputed (it yields
        # the logits) and no one writes into a shared block.
        if seq.block_table:
            raise RuntimeError(f"allocate: {seq.request_id} already holds blocks")
        hits = self._cache_hits(seq)
        for block in hits:
            if block in self._free:
                del self._free[block]
                self._charge(seq)
            self.ref_counts[block] += 1
        fresh = [self._pop_free(seq) for _ in range(seq.num_blocks(self.block_size) - len(hits))]
        seq.block_table = hits + fresh
        seq.num_cached_tokens = len(hits) * self.block_size
        seq.num_computed_tokens = seq.num_cached_tokens

    def can_append(self, seq: Sequence) -> bool:
        """True when position len(seq)-1 has a slot or one free block can provide it."""
        return seq.num_blocks(self.block_size) <= len(seq.block_table) or self.available_to(seq) > 0

    def append_slot(self, seq: Sequence, ahead: int = 0, length: int | None = None) -> None:
        """Make sure position length-1+ahead has a slot (a new block when it crosses a boundary); length: len(seq)
        unless given (a persistent batch's, whose sequences hold their rows only after its sync)."""
        missing = -(-((len(seq) if length is None else length) + ahead) // self.block_size) - len(seq.block_table)
        if missing > 1:
            raise RuntimeError(f"append_slot: {seq.request_id} is {missing} blocks short; allocate() first")
        if missing == 1:
            if not self._free:
                raise RuntimeError("append_slot: no free block; check can_append() first")
            seq.block_table.append(self._pop_free(seq))

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks (its KV is gone: num_computed_tokens becomes 0); while held, they return to
        the pool only at release()."""
        table, seq.block_table, seq.num_computed_tokens = seq.block_table, [], 0
        if self._held is not None:
            self._held.append((table, _group(seq)))
        else:
            self._return(table, _group(seq))

    def hold(self) -> None:
        """A step is in flight on the device and may still write the KV of the sequences it runs: blocks freed from
        now on stay out of the pool until release() (called once that step completed)."""
        if self._held is None:
            self._held = []

    def release(self) -> None:
        held, self._held = self._held or [], None
        for table, group in held:
            self._return(table, group)

    def _return(self, table: list[int], group: str | None) -> None:
        for block in reversed(table):  # tail first: prefixes are evicted last
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self._free[block] = None
                if self.block_hashes[block] is None:
                    self._free.move_to_end(block, last=False)  # nothing reusable: evict first
                if group in self._kept:
                    self._kept[group] = min(self._kept[group] + 1, self._cap[group])

    def can_fork(self, parent: Sequence, child: Sequence) -> bool:
        return child.num_blocks(self.block_size) - self._num_shared(parent, child) <= self.available_to(child)

    def _num_shared(self, parent: Sequence, child: Sequence) -> int:
        return min(parent.num_computed_tokens, len(child) - 1, len(parent)) // self.block_size

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Give `child` (same leading content as `parent`) the parent's full computed blocks, shared.

        The child still needs KV for its last position, so at most (len(child)-1)//block_size
        blocks are shared; the rest are fresh and must be computed.
        """
        shared = self._num_shared(parent, child)
        fresh_needed = child.num_blocks(self.block_size) - shared
        if child.block_table or fresh_needed > self.available_to(child):
            raise RuntimeError(f"fork: {child.request_id} holds blocks or the pool is too small")
        for block in parent.block_table[:shared]:
            self.ref_counts[block] += 1
        child.block_table = parent.block_table[:shared] + [self._pop_free(child) for _ in range(fresh_needed)]
        child.num_cached_tokens = child.num_computed_tokens = shared * self.block_size

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Register the sequence's newly full and computed blocks in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        table = seq.block_table
        num_full = min(seq.num_computed_tokens // self.block_size, len(table))
        first = num_full
        while first > 0 and self.block_hashes[table[first - 1]] is None:
            first -= 1
        parent = self.block_hashes[table[first - 1]] if first > 0 else b""
        assert parent is not None  # the loop above stopped at a hashed block (or at the first)
        for i in range(first, num_full):
            parent = self._block_key(seq, i, parent)
            self.block_hashes[table[i]] = parent
            self._cached.setdefault(parent, table[i])

    def _cache_hits(self, seq: Sequence) -> list[int]:
        """Cached blocks holding the sequence's leading positions (never including position len-1)."""
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        parent = b""
        for i in range((len(seq) - 1) // self.block_size):
            key = self._block_key(seq, i, parent)
            block = self._cached.get(key)
            if block is None:
                break
            hits.append(block)
            parent = key
        return hits

    def _block_key(self, seq: Sequence, index: int, parent: bytes) -> bytes:
        # the ids [bs, num_vq] int64 then the text_mask [bs] of the block's rows, as bytes (Sequence.row_bytes)
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update(seq.cache_salt)
        digest.update(seq.row_bytes(index * self.block_size, (index + 1) * self.block_size))
        return digest.digest()

    def _charge(self, seq: Sequence) -> None:
        """seq took a block off the free list: one fewer kept for its group (past them, it took an unreserved one)."""
        group = _group(seq)
        if group in self._kept:
            self._kept[group] = max(self._kept[group] - 1, 0)

    def _pop_free(self, seq: Sequence) -> int:
        self._charge(seq)
        block, _ = self._free.popitem(last=False)
        key = self.block_hashes[block]
        if key is not None and self._cached.get(key) == block:
            del self._cached[key]
        self.block_hashes[block] = None
        self.ref_counts[block] = 1
        return block


def _group(seq: Sequence) -> str | None:
    return seq.seat_group[0] if seq.seat_group is not None else None
