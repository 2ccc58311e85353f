"""A run's model work on a thread of its own: what it hands back to the page's thread, and the types a run's
steps share (its options, the page's updates)."""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Protocol, TypedDict, TypeVar

import numpy as np

from .clips import RunStats

T = TypeVar("T")
Update = tuple[object, object, object, object, object]  # (live chunk, full audio, download file, spoken text, stats)
Chunk = np.ndarray | Exception | None  # what a stream's producer puts: a float32 chunk, then None or its error


class RunOptions(TypedDict):
    """How a run's text is split and batched (TextOptions.split, SynthesisJob.max_batch), and its stop flag."""

    split: bool
    max_batch: int
    stop: threading.Event


class Wait(Protocol):
    """Handlers._wait: work() on a thread, the page's progress updates meanwhile; its result."""

    def __call__(self, work: Callable[[], T], stats: RunStats, doing: str,
                 stop: threading.Event) -> Generator[Update, None, T]: ...


def outcome(work: Callable[[], T]) -> T | Exception:
    """work()'s result, or the exception it raised (handed to the UI thread, which re-raises it)."""
    try:
        return work()
    except Exception as exc:
        return exc


def batches(ready: queue.Queue[Chunk], every_s: float) -> Iterator[list[np.ndarray]]:
    """A stream's chunks from `ready` (float32 arrays, then None or the exception that ended it): wait for the
    next chunk, then take every chunk already waiting; re-raise a producer error. An empty batch every `every_s`
    without a chunk keeps the progress line moving."""
    while True:
        try:
            batch = [ready.get(timeout=every_s)]
        except queue.Empty:
            yield []
            continue
        while not ready.empty():
            batch.append(ready.get())
        done = batch[-1] is None or isinstance(batch[-1], Exception)
        chunks = [c for c in batch if isinstance(c, np.ndarray)]
        if chunks:
            yield chunks
        if isinstance(batch[-1], Exception):
            raise batch[-1]
        if done:
            return
