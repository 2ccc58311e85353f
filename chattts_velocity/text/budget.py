"""Text stage: the time budget of one request's text work (SSML, normalisation, tokenising).

The work is done in bounded steps (wetext reads at most `numbers.MAX_WETEXT_CHARS` characters a call); the
budget is checked between steps, so a request that would take longer ends with a ValueError naming `input`
instead of holding a worker. The budget is a context variable: set it around the work, in the thread that runs it.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_deadline: ContextVar[tuple[float, float] | None] = ContextVar("text_deadline", default=None)  # (monotonic end, s)


class TextBudgetExceeded(ValueError):
    """The text work of one request ran past its budget (HTTP 400 naming `input`)."""

    code = "input_too_complex"


@contextmanager
def time_budget(seconds: float | None, started: float | None = None) -> Iterator[None]:
    """Text work inside the block must finish within `seconds` (None: no limit) of `started` (a time.monotonic()
    value, e.g. when the job was queued; the same clock in every process of the machine; None: now)."""
    start = time.monotonic() if started is None else started
    token = _deadline.set(None if seconds is None else (start + seconds, seconds))
    try:
        yield
    finally:
        _deadline.reset(token)


def check_budget() -> None:
    """Raise TextBudgetExceeded when the current budget is spent."""
    deadline = _deadline.get()
    if deadline is not None and time.monotonic() > deadline[0]:
        raise TextBudgetExceeded(f"input: preparing the text took over its budget of {deadline[1]:g} s; send "
                                 "shorter or simpler text")
