"""Serving stage: the text work of requests (SSML, normalisation, voices, tokenising) off the event loop.

A small thread pool, so that however many requests arrive at once, at most `workers` threads do text work and the
event loop keeps answering (/health, other clients' streams); texts longer than LONG_TEXT_CHARS are normalised in
worker processes instead (text/pool.py: no GIL shared with the engine and the decode thread), started on first use.
Each job runs under text.budget's time budget, counted from when it was queued: the normaliser checks it between
its bounded steps and ends an over-long or long-queued job with a ValueError naming `input`.
"""
from __future__ import annotations

import asyncio
import logging
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import TypedDict, TypeVar

from ..schema import TextPieces
from ..speech.frontend import TextFrontEnd
from ..text.budget import time_budget
from ..text.pool import split_in_worker, start_worker, uses_default_normalizers

T = TypeVar("T")
logger = logging.getLogger("chattts_velocity.serve")
LONG_TEXT_CHARS = 512  # longer texts go to a worker process (shorter ones cost milliseconds on a thread)


class PieceOptions(TypedDict, total=False):
    """SpeechService.text_pieces()'s keywords: how a request's text becomes its sentence pieces."""

    lang: str | None
    normalize: bool
    split: bool
    max_pieces: int | None


class TextWorker:
    def __init__(self, workers: int = 2, budget_s: float | None = 10.0, processes: int = 0) -> None:
        self.budget_s = budget_s
        self._threads = ThreadPoolExecutor(workers, thread_name_prefix="chattts-text")
        self._process_count = processes
        self._processes = self._new_processes()
        self._portable: dict[int, bool] = {}  # id(normalizer) -> whether a worker process reads as it does

    async def run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """fn(*args, **kwargs) on a text thread, under the budget; its exception is raised here."""
        queued = time.monotonic()

        def job() -> T:
            with time_budget(self.budget_s, queued):
                return fn(*args, **kwargs)

        return await asyncio.get_running_loop().run_in_executor(self._threads, job)

    async def split(self, frontend: TextFrontEnd, text: str, *, lang: str | None = None, normalize: bool = True,
                    split: bool = True) -> TextPieces:
        """frontend.pieces(text, ...) with homophones as normalize: a long text in a worker process when it reads
        the same there."""
        pieces = partial(frontend.pieces, text, lang=lang, normalize=normalize, homophones=normalize, split=split)
        if self._processes is None or len(text) <= LONG_TEXT_CHARS or not self._reads_alike(frontend):
            return await self.run(pieces)
        job = partial(split_in_worker, text, lang, normalize, split, time.monotonic(), self.budget_s)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._processes, job)
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


def at_most(pieces: TextPieces, max_pieces: int | None) -> TextPieces:
    """pieces, or a ValueError naming `input` when they are more than max_pieces."""
    if max_pieces is not None and len(pieces.texts) > max_pieces:
        raise ValueError(f"input: splits into {len(pieces.texts)} sentence pieces, over the limit of {max_pieces}; "
                         "send fewer sentences per request")
    return pieces
