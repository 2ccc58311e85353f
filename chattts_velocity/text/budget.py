"""Text stage: the budget of one request's text work (SSML, normalisation, tokenising).

The work is done in bounded steps (wetext reads at most `numbers.MAX_WETEXT_CHARS` characters a call); the
budget is checked between steps, so a request that would take longer ends with a ValueError naming `input`
instead of holding a worker, and work whose request was cancelled (its client left) ends with TextWorkCancelled.
By default the budget is the CPU time of the thread doing the work, so the work of others on the machine does not
spend it: a text fails for what it costs, never because the server is busy. The budget is a context variable: set
it around the work, in the thread that runs it.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class _Budget:
    end: float  # on `clock`
    seconds: float | None
    clock: Callable[[], float]
    cancelled: threading.Event | None


_budget: ContextVar[_Budget | None] = ContextVar("text_budget", default=None)


class TextBudgetExceeded(ValueError):
    """The text work of one request ran past its budget (HTTP 400 naming `input`)."""

    code = "input_too_complex"


class TextWorkCancelled(RuntimeError):
    """The request this text work was for is gone (its client left); nobody waits for the result."""


@contextmanager
def time_budget(seconds: float | None, started: float | None = None,
                cancelled: threading.Event | None = None) -> Iterator[None]:
    """Text work inside the block must finish within `seconds` (None: no limit): of CPU time of the thread running
    the block, from now; or, given `started` (a time.monotonic() value, the same clock in every process of the
    machine), of wall time from then. Setting `cancelled` ends it at its next check."""
    clock = time.thread_time if started is None else time.monotonic
    start = clock() if started is None else started
    end = float("inf") if seconds is None else start + seconds
    token = _budget.set(_Budget(end, seconds, clock, cancelled))
    try:
        yield
    finally:
        _budget.reset(token)


def check_budget() -> None:
    """Raise TextBudgetExceeded when the current budget is spent, TextWorkCancelled when its request is gone."""
    budget = _budget.get()
    if budget is None:
        return
    if budget.cancelled is not None and budget.cancelled.is_set():
        raise TextWorkCancelled("input: the request was cancelled")
    if budget.clock() > budget.end:
        cpu = " of CPU time" if budget.clock is time.thread_time else ""
        raise TextBudgetExceeded(f"input: preparing the text took over its budget of {budget.seconds:g} s{cpu}; "
                                 "send shorter or simpler text")
