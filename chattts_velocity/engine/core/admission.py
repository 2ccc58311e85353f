"""Engine stage: who is admitted next — fair turns between clients and the seats a running set holds.

In: the waiting and running sequences and the engine config. Out: the order in which the scheduler tries to admit
waiting sequences, and the max_num_seqs seats in use (a beam request's seat group counts once, all its seats).
"""
from __future__ import annotations

import heapq
from collections import Counter, deque

from chattts_velocity.config import EngineConfig
from chattts_velocity.engine.core.sequence import Sequence


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
