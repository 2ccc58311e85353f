"""Engine stage: who is admitted next — fair turns between clients and the seats a running set holds.

In: the waiting and running sequences, the engine config and the block pool. Out: whether a sequence can ever be
admitted, the order in which the scheduler tries to admit waiting sequences, the max_num_seqs seats in use (a beam
request's seat group counts once, all its seats) and the KV blocks a seat group reserves.
"""
from __future__ import annotations

import heapq
from collections import Counter, deque

from chattts_velocity.config import EngineConfig
from chattts_velocity.engine.sched.block_manager import BlockManager
from chattts_velocity.engine.sched.sequence import Sequence
from chattts_velocity.schema import check_prompt_fits


def check_fits(seq: Sequence, config: EngineConfig, pool: BlockManager) -> None:
    """A ValueError naming the field when seq could never run, even alone: too long, too wide, too big for the pool."""
    if seq.seat_group is not None:
        _check_group_fits(seq, seq.seat_group[1], config, pool)
    check_prompt_fits(seq.num_prompt_tokens, seq.params.max_new_token, config.max_model_len, "max_model_len")
    positions = seq.num_prompt_tokens + seq.params.max_new_token
    needed = pool.blocks_for(positions)
    if needed > pool.num_blocks:
        raise ValueError(
            f"max_new_token: prompt + max_new_token = {positions} positions need {needed} KV blocks "
            f"but the pool has {pool.num_blocks}; lower max_new_token or raise kv_cache_memory"
        )


def _check_group_fits(seq: Sequence, width: int, config: EngineConfig, pool: BlockManager) -> None:
    if width > config.max_num_seqs:
        raise ValueError(f"beam_width: {width} beams run as {width} sequences, more than "
                         f"max_num_seqs ({config.max_num_seqs}); lower beam_width")
    blocks = group_blocks(seq, pool.block_size)
    if blocks > pool.num_blocks:
        raise ValueError(
            f"beam_width: {width} beams of prompt ({seq.num_prompt_tokens} positions) + max_new_token "
            f"({seq.params.max_new_token}) reserve {blocks} KV blocks but the pool has {pool.num_blocks}; "
            f"lower beam_width or max_new_token, or raise kv_cache_memory")


def admission_order(waiting: list[Sequence], running: list[Sequence], config: EngineConfig) -> list[Sequence]:
    """The next max_num_seqs waiting sequences to try, in turn: queue order within a client; between clients
    (fcfs scheduling) the one with the fewest running, then admitted, sequences goes next, so a client with
    1,000 queued pieces shares the batch with one that sends a single piece."""
    clients: dict[str, deque[Sequence]] = {}
    for seq in waiting:
        clients.setdefault(seq.client, deque()).append(seq)
    if len(clients) <= 1 or config.scheduling == "priority":
        return waiting[: config.max_num_seqs]
    counts = Counter(seq.client for seq in running)
    turns = [(counts[name], waiting.index(queue[0]), name) for name, queue in clients.items()]
    heapq.heapify(turns)
    order: list[Sequence] = []
    while turns and len(order) < config.max_num_seqs:
        count, _, name = heapq.heappop(turns)
        order.append(clients[name].popleft())
        if clients[name]:
            heapq.heappush(turns, (count + 1, len(order), name))
    return order


def seats_in_use(running: list[Sequence]) -> tuple[int, set[str]]:
    """Seats the running set holds, and the seat groups holding theirs."""
    groups = {seq.seat_group for seq in running if seq.seat_group is not None}
    singles = sum(seq.seat_group is None for seq in running)
    return singles + sum(seats for _, seats in groups), {name for name, _ in groups}


def group_blocks(seq: Sequence, block_size: int) -> int:
    """KV blocks a beam request (seq: any of its beams) reserves when admitted: its prompt's full blocks once, and
    for each of its seats the blocks of one beam's positions past them, up to prompt + max_new_token.

    Why it suffices: a fork shares its parent's full computed blocks (the prompt's among them, BlockManager.fork),
    dead beams are dropped before the survivors fork, so at most `seats` beams hold blocks at once, each at most
    blocks_for(prompt + max_new_token) of them, all sharing the prompt's full blocks.
    """
    assert seq.seat_group is not None
    shared = seq.num_prompt_tokens // block_size
    own = -(-(seq.num_prompt_tokens + seq.params.max_new_token) // block_size) - shared
    return shared + seq.seat_group[1] * own


def blocks_for_admission(seq: Sequence, pool: BlockManager) -> bool:
    """Whether seq's blocks can be allocated; for the first running sequence of a seat group, once the group's
    blocks are reserved (given back if seq still cannot be allocated)."""
    if seq.seat_group is None or pool.is_reserved(seq.seat_group[0]):
        return pool.can_allocate(seq)
    group = seq.seat_group[0]
    if not pool.reserve(group, group_blocks(seq, pool.block_size)):
        return False
    if pool.can_allocate(seq):
        return True
    pool.unreserve(group)
    return False
