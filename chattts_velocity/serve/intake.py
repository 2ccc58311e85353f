"""Serving stage: the one point a speech request passes before any costly work, and its client watched meanwhile.

Admission: a client at its cap of unfinished engine pieces, or with `max_preparing` requests already in text work
(SSML, normalising, the refine pass), gets 429 at once, before its text is read. Then the request is prepared
(text work in the client's turn, serve/fair_turns.py; the refine pass; its first pieces queued) while its client is
watched: a client that leaves cancels the preparation within DISCONNECT_POLL, which aborts its refine requests, ends
its text job at the job's next budget check and closes the pieces it queued.
"""
from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager, suppress
from typing import TypeVar

from starlette.requests import Request

from ..engine.async_engine import AsyncLLMEngine
from ..engine.client_quota import CLIENT, ClientBusy, current_quotas

T = TypeVar("T")
DISCONNECT_POLL = 0.25  # seconds between checks that a request's client is still there


class ClientGone(Exception):
    """The client left while its request was being prepared; the preparation was cancelled."""


class Admission:
    def __init__(self, engine: AsyncLLMEngine, max_preparing: int) -> None:
        self.engine, self.max_preparing = engine, max_preparing
        self.preparing: Counter[str] = Counter()  # requests in text work, by client (dropped at zero)

    @asynccontextmanager
    async def admitted(self) -> AsyncIterator[None]:
        """Inside the block the request counts as its client's (CLIENT's) request in text work; a ClientBusy
        (429) when its client may start no more work now."""
        client = CLIENT.get()
        busy = self.engine.quota_book.busy(current_quotas(self.engine.max_queued_per_client))
        if busy is not None:
            raise busy
        if self.preparing[client] >= self.max_preparing:
            raise ClientBusy(f"input: this client has {self.max_preparing} requests being prepared (text work, "
                             "refine), the most it may have; retry when one has started")
        self.preparing[client] += 1
        try:
            yield
        finally:
            self.preparing[client] -= 1
            if self.preparing[client] <= 0:
                del self.preparing[client]


async def unless_gone(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result; if the request's client disconnects first, `work` is cancelled (and awaited) and
    ClientGone is raised."""
    task = asyncio.ensure_future(work)
    try:
        while not (await asyncio.wait({task}, timeout=DISCONNECT_POLL))[0]:
            if await request.is_disconnected():
                raise ClientGone
        return task.result()
    finally:
        if not task.done():
            task.cancel()
            with suppress(Exception, asyncio.CancelledError):  # its own ending does not matter now
                await task
