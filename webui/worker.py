"""A run's model work on a thread of its own: what it hands back to the page's thread."""
from __future__ import annotations

import queue
from collections.abc import Callable, Iterator

import numpy as np


def outcome(work: Callable[[], object]) -> object:
    """work()'s result, or the exception it raised (handed to the UI thread, which re-raises it)."""
    try:
        return work()
    except Exception as exc:
        return exc


def batches(ready: queue.Queue, every_s: float) -> Iterator[list[np.ndarray]]:
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
