"""Serving stage: the text work of requests (SSML, normalisation, voices, tokenising) off the event loop.

A small thread pool, so that however many requests arrive at once, at most `workers` threads do text work and the
event loop keeps answering (/health, other clients' streams). Each job runs under text.budget's time budget: the
normaliser checks it between its bounded steps and ends an over-long job with a ValueError naming `input`.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ..text.budget import time_budget

T = TypeVar("T")


class TextWorker:
    def __init__(self, workers: int = 2, budget_s: float | None = 10.0) -> None:
        self.budget_s = budget_s
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="chattts-text")

    async def run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """fn(*args, **kwargs) on a text thread, under the budget; its exception is raised here."""
        def job() -> T:
            with time_budget(self.budget_s):
                return fn(*args, **kwargs)

        return await asyncio.get_running_loop().run_in_executor(self._pool, job)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
