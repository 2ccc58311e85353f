"""Serving stage: fair turns at a pool of workers (the text threads, the text process), by client.

At most `slots` jobs run at once. When one ends, the next job is the oldest waiting one of the client with the
fewest jobs running, then of the one served least recently (round robin), so one client queueing a hundred texts
delays another client's one text by at most the jobs already running, never by its whole queue. A client runs at
most half the slots at once (at least one), so a newcomer finds a slot free however long the running jobs are.
One event loop; records of clients with nothing running or waiting are dropped.
"""
from __future__ import annotations

import asyncio
import itertools
from collections import Counter, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class FairTurns:
    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.per_client = max(1, slots // 2)  # slots one client may hold at once
        self.running: Counter[str] = Counter()
        self._waiting: dict[str, deque[tuple[int, asyncio.Future[None]]]] = {}  # client -> (arrival, its wake-up)
        self._arrivals = itertools.count()  # also the clock of `_served`
        self._served: dict[str, int] = {}  # client -> when it last got a slot (while it has jobs)

    @asynccontextmanager
    async def turn(self, client: str) -> AsyncIterator[None]:
        """Hold one slot for `client` inside the block (waiting for its turn first; cancelling the wait leaves the
        queue)."""
        await self._wait(client)
        try:
            yield
        finally:
            self._release(client)

    async def _wait(self, client: str) -> None:
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (next(self._arrivals), wake)
        self._waiting.setdefault(client, deque()).append(entry)
        self._grant()  # a free slot this client may take: at once
        try:
            await wake
        except asyncio.CancelledError:
            if wake.done() and not wake.cancelled():  # granted as it was cancelled: hand the slot on
                self._release(client)
            else:
                self._leave_queue(client, entry)
            raise

    def _leave_queue(self, client: str, entry: tuple[int, asyncio.Future[None]]) -> None:
        queue = self._waiting.get(client)
        if queue is not None and entry in queue:
            queue.remove(entry)
            if not queue:
                del self._waiting[client]
        self._forget(client)

    def _release(self, client: str) -> None:
        self.running[client] -= 1
        if self.running[client] <= 0:
            del self.running[client]
            self._forget(client)
        self._grant()

    def _start(self, client: str) -> None:
        self.running[client] += 1
        self._served[client] = next(self._arrivals)

    def _forget(self, client: str) -> None:
        if client not in self.running and client not in self._waiting:
            self._served.pop(client, None)

    def _grant(self) -> None:
        while sum(self.running.values()) < self.slots:
            ready = [c for c in self._waiting if self.running.get(c, 0) < self.per_client]
            if not ready:
                return
            client = min(ready, key=lambda c: (self.running.get(c, 0), self._served.get(c, -1), self._waiting[c][0][0]))
            queue = self._waiting[client]
            _, wake = queue.popleft()
            if not queue:
                del self._waiting[client]
            if wake.cancelled():  # its task was cancelled and has not run its handler yet
                self._forget(client)
                continue
            self._start(client)
            wake.set_result(None)
