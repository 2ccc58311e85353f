"""A run's model work on a thread of its own: what it hands back to the page's thread, and the types a run's
steps share (its options, the page's updates)."""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Protocol, TypedDict, TypeVar

import gradio as gr
import numpy as np

from .clips import RunStats

if TYPE_CHECKING:
    from chattts_velocity.speech import Synthesis

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

    def __call__(self, work: Callable[[], T], stats: RunStats, doing: str | Callable[[], str],
                 stop: threading.Event, note: Callable[[], object] = ...) -> Generator[Update, None, T]: ...


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


class ShownText:
    """What the page's spoken-text box shows for a run: the text as typed, or the refined text once the job's
    refine pass has ended (shown once while the run goes on, and again with the result)."""

    def __init__(self, synthesis: Synthesis, typed: str) -> None:
        self.synthesis, self.typed, self.shown = synthesis, typed, False

    def text(self) -> str:
        return self.typed if self.synthesis.refined is None else self.synthesis.refined[0]

    def doing(self, after: str = "generating") -> str:
        """The progress line's verb: refining until the refine pass has ended."""
        return "refining the text" if self.synthesis.job.refine is not None and self.synthesis.refined is None \
            else after

    def update(self) -> object:
        """The box's update now: the refined text the first time it is known, else no change."""
        if self.shown or self.synthesis.refined is None:
            return gr.skip()
        self.shown = True
        return self.text()
