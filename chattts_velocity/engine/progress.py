"""Progress of long work (engine steps, export lines): a live bar on a terminal or in a notebook, one summary line
when stderr is a log file or a pipe (a bar's carriage-return frames would fill it)."""
from __future__ import annotations

import sys
import time
from typing import Protocol

from tqdm.auto import tqdm


class Progress(Protocol):
    def update(self, n: int = 1) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Progress: ...

    def __exit__(self, *exc: object) -> None: ...


def progress_bar(total: int, desc: str, unit: str, enabled: bool = True, leave: bool = False) -> Progress:
    """tqdm where someone watches it live; elsewhere a Summary that writes one line when the work ends."""
    if enabled and not _live():
        return Summary(total, desc, unit)
    bar: Progress = tqdm(total=total, desc=desc, unit=unit, disable=not enabled, leave=leave)
    return bar


def _live() -> bool:
    notebook = tqdm.__module__.startswith("tqdm.notebook")  # tqdm.auto picked the notebook widget
    return notebook or bool(getattr(sys.stderr, "isatty", lambda: False)())


class Summary:
    """Counts like a tqdm bar; on close writes `desc: done/total units in S s (R units/s)` to stderr once."""

    def __init__(self, total: int, desc: str, unit: str) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.n, self.started, self.closed = 0, time.perf_counter(), False

    def update(self, n: int = 1) -> None:
        self.n += n

    def close(self) -> None:
        if self.closed or self.n == 0:
            self.closed = True
            return
        self.closed = True
        seconds = time.perf_counter() - self.started
        rate = f" ({format_rate(self.n, seconds, self.unit)})" if seconds > 0 else ""
        print(f"{self.desc}: {self.n}/{self.total} {self.unit}s in {seconds:.1f} s{rate}", file=sys.stderr,
              flush=True)

    def __enter__(self) -> Summary:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def format_rate(count: int, seconds: float, unit: str) -> str:
    """A rate readable at any speed: "12.5 lines/s", "0.03 lines/s", or "33 s a line" below 0.01 a second."""
    rate = count / seconds
    if rate >= 9.95:
        return f"{rate:.0f} {unit}s/s"
    if rate >= 0.995:
        return f"{rate:.1f} {unit}s/s"
    if rate >= 0.01:
        return f"{rate:.2g} {unit}s/s"
    return f"{seconds / count:.0f} s a {unit}"
