"""Engine stage: AsyncLLMEngine — one LLMEngine stepped by a background thread, shared by many asyncio callers.

In: `async for delta in engine.generate(prompt, params)` from any number of coroutines.
Out: each request's GenerationOutput deltas ([n, rows] tokens, [n, H] hidden) as the shared batch steps.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from chattts_velocity.engine.client_quota import CLIENT as CLIENT  # serve/ imports these three from here
from chattts_velocity.engine.client_quota import QUOTAS as QUOTAS
from chattts_velocity.engine.client_quota import ClientBusy as ClientBusy
from chattts_velocity.engine.client_quota import QuotaBook, Quotas, current_quotas
from chattts_velocity.engine.llm_engine import LLMEngine
from chattts_velocity.engine.request_stream import RequestStream as RequestStream  # serve/ imports it from here
from chattts_velocity.engine.request_stream import put_rows
from chattts_velocity.engine.sched.step import SteadyRows
from chattts_velocity.schema import GenerationOutput, Prompt, SamplingParams

logger = logging.getLogger("chattts_velocity")
IDLE_WAIT = 0.5  # seconds the idle loop sleeps between checks of the stop flag


@dataclass
class AsyncStats:
    """Request-level counters kept by the background loop (for /metrics and tests)."""

    num_requests: int = 0
    num_finished: int = 0
    num_aborted: int = 0  # requests dropped because their consumer went away or asked to
    max_batch_size: int = 0  # largest number of sequences one step has run so far
    num_shared_steps: int = 0  # steps that ran more than one sequence


@dataclass
class _Add:
    stream: RequestStream
    prompt: Prompt
    params: SamplingParams
    quotas: Quotas  # the (counter, cap) pairs it counts against (engine/client_quota.py)
    capped: bool = True  # False: never refused for its client's unfinished requests (still counted)


@dataclass
class _Abort:
    request_id: str


class AsyncLLMEngine:
    """Continuous batching for asyncio: requests join the running batch between steps, leave on cancel.

    NOTE on threading: only the background thread touches `engine` (add, abort, step). Callers talk
    to it through `_commands`, and it answers through each request's `RequestStream`. The step is
    CPU-bound torch code that releases the GIL, so the event loop stays responsive while it runs.
    """

    def __init__(self, engine: LLMEngine, max_queued_per_client: int | None = None) -> None:
        self.engine = engine
        self.max_queued_per_client = max_queued_per_client  # unfinished requests one named client may have
        self.quota_book = QuotaBook()  # unfinished requests by quota counter (written by the engine thread only)
        self.stats = AsyncStats()
        self._commands: queue.SimpleQueue[_Add | _Abort] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, RequestStream] = {}  # the request tracker (engine thread only)
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stop = False
        self._steps_seen = engine.stats.num_steps
        # the last persistent batch's slots (its request_ids list) and its requests grouped by event loop
        self._fanned: tuple[list[str] | None, dict[asyncio.AbstractEventLoop, list[tuple[int, RequestStream]]]] = (
            None, {})
        self.error: BaseException | None = None  # set when the loop itself died
        self.failing = False  # the latest step failed some of its requests (health: degraded)

    # ---- lifecycle ---------------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop

    def start(self) -> None:
        """Start the background loop (idempotent; add_request calls it)."""
        if self.error is not None:
            raise RuntimeError(f"engine: the background loop failed: {self.error!r}")
        if self._thread is None or not self._thread.is_alive():
            self._stop = False
            self._thread = threading.Thread(target=self._loop, name="chattts-engine", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the loop after the current step; unfinished requests end with RuntimeError."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = None

    # ---- requests ----------------------------------------------------------------------------
    async def generate(
        self, prompt: Prompt, params: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[GenerationOutput]:
        """Yield the request's deltas as the shared batch steps. Closing or cancelling the consumer aborts it."""
        stream = await self.add_request(prompt, params, request_id)
        async for delta in self.outputs(stream):
            yield delta

    async def outputs(self, stream: RequestStream) -> AsyncIterator[GenerationOutput]:
        """The deltas of a request from add_request (a RuntimeError if the loop dies meanwhile)."""
        try:
            while not stream.finished:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    stream.finished = True
                    raise item
                stream.finished = item.finished
                if item.error is not None:  # this request failed in a step; the others go on
                    raise item.error
                yield item
        finally:
            if not stream.finished:
                self.abort(stream.request_id)

    async def add_request(
        self, prompt: Prompt, params: SamplingParams, request_id: str | None = None, capped: bool = True
    ) -> RequestStream:
        """Queue a request and wait until the loop accepted it (a bad request raises ValueError here). Its client is
        CLIENT's value in the caller's context; `capped=False`: a later part of a request already accepted, never
        refused for max_queued_per_client."""
        self.start()
        request_id = request_id if request_id is not None else f"async-{next(self._ids)}"
        stream = RequestStream(request_id, asyncio.get_running_loop(), CLIENT.get())
        self._send(_Add(stream, prompt, params, current_quotas(self.max_queued_per_client), capped))
        try:
            await stream.accepted
        except asyncio.CancelledError:
            self.abort(request_id)
            raise
        return stream

    def check(self, prompt: Prompt, params: SamplingParams) -> None:
        """add_request's ValueError for a request too large for the engine, raised here and queuing nothing."""
        self.engine.check_request(prompt, params)

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread: it leaves before the next step, its blocks are freed and its consumer's
        iteration ends with a finish_reason "abort" delta. Unknown or finished ids are ignored."""
        if self.is_running:
            self._commands.put(_Abort(request_id))
            self._wake.set()

    def metrics(self) -> dict[str, float | str]:
        """Engine gauges plus the request counters (read without locking: values may be one step stale)."""
        s, blocks = self.stats, self.engine.block_manager
        return {**self.engine.metrics(), "num_requests": s.num_requests, "num_finished": s.num_finished,
                "num_aborted": s.num_aborted, "max_batch_size": s.max_batch_size,
                "num_shared_steps": s.num_shared_steps, "kv_blocks_used": blocks.num_used_blocks,
                "kv_blocks_total": blocks.num_blocks}

    # ---- background thread -------------------------------------------------------------------
    def _send(self, command: _Add) -> None:
        self._commands.put(command)
        self._wake.set()
        # NOTE: the loop sets _stop before its final drain, so a command put while _stop was
        # still False is always seen (and refused) by that drain; otherwise we refuse it here.
        if self._stop or self.error is not None:
            raise RuntimeError("engine: the background loop is not running")

    def _loop(self) -> None:
        try:
            while not self._stop:
                self._run_commands()
                if not self.engine.has_unfinished_requests():
                    self._wake.wait(IDLE_WAIT)
                    self._wake.clear()
                    continue
                self._step()
        except BaseException as exc:  # only what _step does not survive (a bug in the loop itself, an interrupt)
            logger.exception("engine loop failed")
            self.error = exc
        self._stop = True
        self._fail_all(RuntimeError(f"engine: stopped ({self.error!r})" if self.error else "engine: shut down"))

    def _run_commands(self, refuse: BaseException | None = None) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Abort):
                self._abort(command.request_id)
            elif refuse is not None:
                command.stream.resolve(refuse)
            else:
                self._add(command)

    def _add(self, command: _Add) -> None:
        stream = command.stream
        if stream.request_id in self._streams:
            stream.resolve(ValueError(f"request_id: {stream.request_id!r} is already running; use a unique id"))
            return
        busy = self.quota_book.busy(command.quotas) if command.capped else None
        if busy is not None:
            stream.resolve(busy)
            return
        try:
            self.engine.add_request(stream.request_id, command.prompt, command.params, stream.client)
        except ValueError as exc:
            stream.resolve(exc)
            return
        self.quota_book.count(stream.request_id, command.quotas)
        self._streams[stream.request_id] = stream
        self.stats.num_requests += 1
        stream.resolve(None)

    def _abort(self, request_id: str) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            self.quota_book.release(request_id)
            self.engine.abort_request(request_id)
            self.stats.num_aborted += 1
            stream.put(GenerationOutput.ended(request_id, "abort"))

    def _step(self) -> None:
        """One engine step. A step that raises fails the requests it held, and the loop serves everyone else."""
        try:
            deltas = self.engine.step_deltas()
        except Exception as exc:  # noqa: BLE001 -- the engine could not say whose fault it was
            logger.exception("engine step failed; failing the requests it held")
            self.failing = True
            self._fail_all(RuntimeError(f"engine: a step failed ({exc!r}); this request was in it"), refuse=False)
            return
        singles = deltas.singles()
        self.failing = any(d.error is not None for d in singles)
        if deltas.steady is not None:
            self._fan_out(deltas.steady)
        self._deliver(singles)

    def _fan_out(self, block: SteadyRows) -> None:
        """A steady step's rows: one call into each event loop that has requests in the batch (not one per
        request); that loop hands each of its requests its row."""
        if block.request_ids is not self._fanned[0]:  # a new persistent batch: its requests by loop, once
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[int, RequestStream]]] = {}
            for slot, rid in enumerate(block.request_ids):
                stream = self._streams.get(rid)
                if stream is not None:
                    by_loop.setdefault(stream.loop, []).append((slot, stream))
            self._fanned = (block.request_ids, by_loop)
        for loop, pairs in self._fanned[1].items():
            try:
                loop.call_soon_threadsafe(put_rows, block, pairs)
            except RuntimeError:  # the owner's loop is closed: nobody is listening any more
                pass

    def _deliver(self, deltas: list[GenerationOutput]) -> None:
        if self.engine.stats.num_steps > self._steps_seen:  # step() ran the model (not an empty schedule)
            self._steps_seen = self.engine.stats.num_steps
            size = self.engine.stats.last_batch_size
            self.stats.max_batch_size = max(self.stats.max_batch_size, size)
            self.stats.num_shared_steps += size > 1
        for delta in deltas:
            stream = self._streams.get(delta.request_id)
            if stream is None:
                continue  # aborted while the step ran
            if delta.finished:
                del self._streams[delta.request_id]
                self.quota_book.release(delta.request_id)
                self.stats.num_finished += 1
            stream.put(delta)

    def _fail_all(self, error: BaseException, refuse: bool = True) -> None:
        if refuse:
            self._run_commands(refuse=error)
        for request_id, stream in self._streams.items():
            self.engine.abort_request(request_id)
            stream.put(error)
        self._streams.clear()
        self.quota_book.clear()

