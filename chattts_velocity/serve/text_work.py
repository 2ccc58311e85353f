"""Serving stage: the text work of requests (SSML, normalisation, voices, tokenising) off the event loop.

A small thread pool, so that however many requests arrive at once, at most `workers` threads do text work and the
event loop keeps answering (/health, other clients' streams); texts longer than LONG_TEXT_CHARS are normalised in
worker processes instead (text/pool.py: no GIL shared with the engine and the decode thread), started on first use.
Clients take turns at both (serve/fair_turns.py: the next job is the oldest of the client with the fewest running).
Each job runs under text.budget's budget of CPU time (what the job itself costs, not how busy the server is): the
normaliser checks it between its bounded steps and ends an over-long job with a ValueError naming `input`; a job
whose request is cancelled (its client left) ends at its next check.
"""
from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import TypedDict, TypeVar

from ..engine.client_quota import CLIENT
from ..schema import TextPieces
from ..speech.frontend import TextFrontEnd
from ..speech.job import SynthesisJob
from ..speech.stages import Stages
from ..text.budget import time_budget
from ..text.pool import split_in_worker, start_worker, uses_default_normalizers
from .fair_turns import FairTurns

T = TypeVar("T")
logger = logging.getLogger("chattts_velocity.serve")
LONG_TEXT_CHARS = 256  # longer texts go to a worker process (shorter ones cost tens of ms on a thread, GIL held)


class PieceOptions(TypedDict, total=False):
    """SpeechService.job()'s text keywords: how a request's text becomes its sentence pieces (homophones follow
    normalize), and how many it may split into."""

    lang: str | None
    normalize: bool
    split: bool
    max_pieces: int | None


class TextWorker:
    def __init__(self, workers: int = 2, budget_s: float | None = 10.0, processes: int = 0) -> None:
        self.budget_s = budget_s
        self._threads = ThreadPoolExecutor(workers, thread_name_prefix="chattts-text")
        self.turns = FairTurns(workers)  # who runs next on the threads
        self._process_turns = FairTurns(max(processes, 1))
        self._process_count = processes
        self._processes = self._new_processes()
        self._portable: dict[int, bool] = {}  # id(normalizer) -> whether a worker process reads as it does

    async def run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """fn(*args, **kwargs) on a text thread, in its client's turn, under the budget; its exception is raised
        here. Cancelled, it ends the job at the job's next budget check."""
        cancelled = threading.Event()

        def job() -> T:
            with time_budget(self.budget_s, cancelled=cancelled):
                return fn(*args, **kwargs)

        async with self.turns.turn(CLIENT.get()):
            try:
                return await asyncio.get_running_loop().run_in_executor(self._threads, job)
            except asyncio.CancelledError:
                cancelled.set()
                raise

    async def split(self, stages: Stages, job: SynthesisJob) -> TextPieces:
        """stages.pieces(job): a long job's texts in a worker process when its front end reads the same there."""
        pieces = partial(stages.pieces, job)
        if self._processes is None or sum(map(len, job.texts)) <= LONG_TEXT_CHARS \
                or not self._reads_alike(stages.frontend):
            return await self.run(pieces)
        o = job.text
        work = partial(split_in_worker, job.texts, o.lang, o.normalize, o.homophones, o.split, None, self.budget_s)
        try:
            async with self._process_turns.turn(CLIENT.get()):
                return await asyncio.get_running_loop().run_in_executor(self._processes, work)
        except BrokenProcessPool:  # a worker died (killed, out of memory): new workers, and this text on a thread
            logger.warning("text worker process died; starting new ones")
            self._processes = self._new_processes()
            return await self.run(pieces)

    def _new_processes(self) -> ProcessPoolExecutor | None:
        if self._process_count == 0:
            return None
        return ProcessPoolExecutor(self._process_count, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=start_worker)

    def _reads_alike(self, frontend: TextFrontEnd) -> bool:
        key = id(frontend.normalizer)
        if key not in self._portable:
            self._portable[key] = uses_default_normalizers(frontend.normalizer)
        return self._portable[key]

    def shutdown(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        if self._processes is not None:
            self._processes.shutdown(wait=True, cancel_futures=True)  # running jobs end within their budget

