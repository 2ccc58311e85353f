"""One synthesis job and its verbs: `stream()` (audio as it is made) and `run()` (the whole of it: the stream
collected), `astream()` / `arun()` for an event loop, `open()` (the server's: a started stream of one track),
`each()` (each text's result as it finishes) and `cancel()`.

A `Synthesis` is a `SynthesisJob` (job.py) bound to its pipeline's stages and to the runner that does its GPT work,
chosen once (`SpeechPipeline.synthesis(job, runner)`): the local runner (speech/local_runner.py: the pipeline's
CallGate and a GPTBackend, one call at a time, the caller's thread) or the server's engine runner
(serve/engine_runner.py: the shared AsyncLLMEngine, many jobs at once, one decode thread for every job's windows).
Either runs the job's refine pass first (its texts then in `refined`) and stops early when the job's stop flag,
`SpeechPipeline.interrupt()` or this job's own `cancel()` says so.
"""
from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..audio.timestamps import Spoken, Timeline
from .calls import Stop
from .job import SynthesisJob
from .prepare import PreparedJob
from .streams import StreamOptions

if TYPE_CHECKING:
    from .stages import Stages

Chunks = list[np.ndarray]  # one new (maybe empty) float32 24 kHz chunk per text
Result = np.ndarray | Spoken | Exception  # each(): a text's waveform (Spoken with timestamps), or its error


class AudioStream(Protocol):
    """A started job's audio as one track (the server's response): float32 chunks in order, its texts one after
    another with a script's pauses between them, and what the response reports beside the audio."""

    started: float  # perf_counter() when the job was opened
    first_audio: float | None  # seconds from open to the first chunk
    timeline: Timeline  # a span per piece whose audio has all been read (and the pauses)

    def __aiter__(self) -> AsyncIterator[np.ndarray]: ...

    def usage(self) -> dict[str, int]: ...

    def close(self) -> None: ...


class Runner(Protocol):
    """Where a job's GPT work runs (one chosen per job). A verb a runner cannot offer raises RuntimeError."""

    def prepare_now(self, synthesis: Synthesis) -> PreparedJob | None: ...

    def run(self, synthesis: Synthesis) -> list[np.ndarray] | list[str]: ...

    def stream(self, synthesis: Synthesis) -> Iterator[Chunks]: ...

    def each(self, synthesis: Synthesis) -> Iterator[tuple[int, Result]]: ...

    async def arun(self, synthesis: Synthesis) -> list[np.ndarray] | list[str]: ...

    def astream(self, synthesis: Synthesis) -> AsyncIterator[Chunks]: ...

    async def open(self, synthesis: Synthesis) -> AudioStream: ...


class Synthesis:
    """A job's verbs on one pipeline and runner. With the local runner its texts are checked (and a refine prompt
    built) when it is made, before the call waits for its turn; the engine runner checks them in open(), on the
    server's text workers."""

    def __init__(self, stages: Stages, job: SynthesisJob, runner: Runner,
                 chunking: StreamOptions | None = None) -> None:
        self.stages, self.job, self.runner = stages, job, runner
        self.cancelled = threading.Event()
        self.refined: list[str] | None = None  # the refine pass's texts (one per text) once it has run
        self.on_cancel: list[Callable[[], None]] = []  # what cancel() also does (the engine runner: abort)
        self.prepared = runner.prepare_now(self)  # the local runner checks the texts here
        first = job.params_list()[:1]
        self.chunking = chunking or (StreamOptions(chunk_steps=first[0].stream_batch) if first else StreamOptions())

    def cancel(self) -> None:
        """Stop this job after its current step (running or waiting for its turn); it ends with what it has."""
        self.cancelled.set()
        for stop in self.on_cancel:
            stop()

    def run(self) -> list[np.ndarray] | list[str]:
        """The whole job: one float32 24 kHz waveform per text (its chunks joined in order), or with `refine_only`
        one refined string per text."""
        self._check_audio_verb("run", refine_only_ok=True)
        return self.runner.run(self)

    def stream(self) -> Iterator[Chunks]:
        """Each yield holds one new (maybe empty) chunk per text, in the job's shape; a text's chunks concatenate to
        its run() waveform. The local call holds the model until the iterator ends or is closed."""
        self._check_audio_verb("stream")
        return self.runner.stream(self)

    def each(self) -> Iterator[tuple[int, Result]]:
        """Each text on its own params, all in one batch: (index, waveform) as texts finish (with the job's
        `timestamps`, a Spoken with each piece's span). A text that cannot be made, or whose generation fails,
        yields (index, its error) and the others go on; the texts refused before generation come first."""
        if self.job.shape != "each":
            raise ValueError(f"shape: each() is the verb of shape 'each' jobs, this one's is {self.job.shape!r}")
        return self.runner.each(self)

    async def arun(self) -> list[np.ndarray] | list[str]:
        """run() for an event loop: cancelling the awaiting task cancels the job."""
        self._check_audio_verb("arun", refine_only_ok=True)
        return await self.runner.arun(self)

    def astream(self) -> AsyncIterator[Chunks]:
        """stream() for an event loop: closing the iterator or cancelling the task cancels the job."""
        self._check_audio_verb("astream")
        return self.runner.astream(self)

    async def open(self) -> AudioStream:
        """The job prepared (text work, refine pass) and started: its audio as one track (AudioStream). Bad input
        raises here, before any audio."""
        self._check_audio_verb("open")
        return await self.runner.open(self)

    def _check_audio_verb(self, verb: str, refine_only_ok: bool = False) -> None:
        if self.job.shape == "each":
            raise ValueError(f"shape: a job of shape 'each' gives its results through each(), not {verb}()")
        if self.job.refine_only and not refine_only_ok:
            raise ValueError("refine_only: a stream is audio; refine the texts with run(refine_only=True)")

    def stop_flag(self) -> Stop:
        """cancel() or the job's own stop flag."""
        own, theirs = self.cancelled.is_set, self.job.stop
        return own if theirs is None else (lambda: own() or theirs())


def collect(chunks: Iterable[Chunks], num_texts: int) -> list[np.ndarray]:
    """A stream's chunks joined per text (float32)."""
    parts: list[list[np.ndarray]] = [[] for _ in range(num_texts)]
    for texts in chunks:
        for text, chunk in zip(parts, texts, strict=True):
            text.append(chunk)
    return [p[0] if len(p) == 1 else np.concatenate(p).astype(np.float32) if p else np.zeros(0, np.float32)
            for p in parts]
