"""Engine stage: RequestStream — one async request's delivery channel from the engine thread to its event loop.

In: the engine thread's deltas (AsyncLLMEngine, engine/async_engine.py). Out: the request's queue, read by its owner's
event loop.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from chattts_velocity.engine.sched.step import SteadyRows
from chattts_velocity.schema import GenerationOutput


class RequestStream:
    """One request's delivery channel: the engine thread puts, the owner's event loop gets."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop, client: str = "") -> None:
        self.request_id, self.loop, self.client = request_id, loop, client
        self.queue: asyncio.Queue[GenerationOutput | BaseException] = asyncio.Queue()
        self.accepted: asyncio.Future[None] = loop.create_future()
        self.finished = False

    def put(self, item: GenerationOutput | BaseException) -> None:
        """Called from the engine thread."""
        self._call(self.queue.put_nowait, item)

    def resolve(self, error: BaseException | None) -> None:
        """Called from the engine thread once the request was added (or refused)."""
        self._call(self._settle, error)

    def _settle(self, error: BaseException | None) -> None:
        if self.accepted.done():
            return
        if error is None:
            self.accepted.set_result(None)
        else:
            self.accepted.set_exception(error)

    def _call(self, func: Callable[[Any], None], arg: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(func, arg)
        except RuntimeError:  # the owner's loop is closed: nobody is listening any more
            pass


def put_rows(block: SteadyRows, pairs: list[tuple[int, RequestStream]]) -> None:
    """In a request's event loop: each of its requests in a steady block gets its row."""
    live = block.live
    for slot, stream in pairs:
        if live is None or live[slot]:  # a slot that ended with the step has its own delta
            stream.queue.put_nowait(block.delta(slot))
