"""One synthesis job's two verbs: `stream()` (audio as it is made) and `run()` (the whole of it: the stream collected).

A `Synthesis` is a `SynthesisJob` bound to its pipeline's steps (`SpeechPipeline.synthesis(job)`). Its shape
(`SynthesisJob.shape`) says what the stream hands out: "whole" (each text's clip once it is complete, decoded whole;
the bytes `run` has always given) or "chunks" (StreamDecoder windows as the GPT makes rows: speech/streams.py, within
1e-5 of the whole clip). `run` concatenates the stream's chunks per text whatever the shape. Both hold the model for
the call (the pipeline's CallGate) and stop early when the job's stop flag, `SpeechPipeline.interrupt()` or this
call's own `cancel()` says so. `arun` / `astream` are the same verbs for an event loop: the stream runs on a thread
and cancelling the awaiting task cancels the call.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Protocol

import numpy as np
import torch

from ..engine.gpt import GPTBackend
from .calls import CallGate, Stop
from .job import SynthesisJob
from .prepare import PreparedJob
from .streams import StreamOptions, StreamSet, stream_texts

Chunks = list[np.ndarray]  # one new (maybe empty) float32 24 kHz chunk per text
_DONE = object()  # the end of an async stream's queue


class Steps(Protocol):
    """What a synthesis needs of its pipeline: the job made ready, its GPT backend, the call gate."""

    gate: CallGate

    def prepare(self, job: SynthesisJob) -> PreparedJob: ...

    def refined(self, prepared: PreparedJob, token_ids: list[torch.Tensor]) -> PreparedJob: ...

    def gpt(self, use_vllm: bool | None = None) -> GPTBackend: ...


class Synthesis:
    """A job's run and stream on one pipeline. Texts are checked (and a refine prompt built) when it is made, before
    the call waits for its turn."""

    def __init__(self, steps: Steps, job: SynthesisJob, chunking: StreamOptions | None = None) -> None:
        self.steps, self.job = steps, job
        self.prepared = steps.prepare(job)
        self.chunking = chunking or StreamOptions(chunk_steps=job.params_list()[0].stream_batch)
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        """Stop this call after its current step (running or waiting for its turn); it ends with what it has."""
        self.cancelled.set()

    def run(self) -> list[np.ndarray] | list[str]:
        """The whole job: one float32 24 kHz waveform per text (its chunks joined in order), or with `refine_only`
        one refined string per text."""
        if self.job.refine_only:
            with self.steps.gate.call(self._stop_flag()) as stop:
                return self._ready(stop).refined_texts()
        return collect(self.stream(), len(self.job.texts))

    def stream(self) -> Iterator[Chunks]:
        """Each yield holds one new (maybe empty) chunk per text, in the job's shape; a text's chunks concatenate to
        its run() waveform. The call holds the model from its first chunk until the iterator ends or is closed."""
        if self.job.refine_only:
            raise ValueError("refine_only: a stream is audio; refine the texts with run(refine_only=True)")
        with self.steps.gate.call(self._stop_flag()) as stop:
            prepared = self._ready(stop)
            if prepared.requests is None:
                raise RuntimeError("stream: a prepared job without code requests (refine_only)")
            gpt = self.steps.gpt(self.job.use_vllm)
            if self.job.shape == "chunks":
                yield from stream_texts(StreamSet(self.chunking), gpt, prepared.requests, prepared.mel, stop)
                return
            outputs = gpt.generate(prepared.requests.prompts, prepared.requests.sampling, self.job.shows_progress(),
                                   stop, max_batch=self.job.max_batch)
            yield [np.concatenate(g).astype(np.float32) if g else np.zeros(0, np.float32)
                   for g in prepared.requests.pieces.group(prepared.mel.decode(outputs))]

    async def arun(self) -> list[np.ndarray] | list[str]:
        """run() for an event loop: cancelling the awaiting task cancels the call."""
        if self.job.refine_only:
            try:
                return await asyncio.to_thread(self.run)
            except asyncio.CancelledError:
                self.cancel()
                raise
        chunks = [c async for c in self.astream()]
        return collect(iter(chunks), len(self.job.texts))

    async def astream(self) -> AsyncIterator[Chunks]:
        """stream() for an event loop: the model runs on a thread; closing the iterator or cancelling the task
        cancels the call."""
        loop, queue = asyncio.get_running_loop(), asyncio.Queue[object]()

        def produce() -> None:
            try:
                for chunks in self.stream():
                    loop.call_soon_threadsafe(queue.put_nowait, chunks)
                    if self.cancelled.is_set():
                        break
            except BaseException as exc:  # noqa: BLE001  # handed to the awaiting side, raised there
                loop.call_soon_threadsafe(queue.put_nowait, exc)
            loop.call_soon_threadsafe(queue.put_nowait, _DONE)

        worker = asyncio.ensure_future(asyncio.to_thread(produce))
        try:
            while (item := await queue.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                yield item  # type: ignore[misc]  # the queue holds Chunks, an error or _DONE
        finally:
            self.cancel()
            await asyncio.shield(worker)

    def _stop_flag(self) -> Stop:
        own, theirs = self.cancelled.is_set, self.job.stop
        return own if theirs is None else (lambda: own() or theirs())

    def _ready(self, stop: Stop) -> PreparedJob:
        """The prepared job with its pending refine pass run on its GPT backend, in the call's turn."""
        prepared = self.prepared
        while (work := prepared.pending) is not None:
            outputs = self.steps.gpt(self.job.use_vllm).generate(work.prompts, work.sampling, work.progress, stop,
                                                                 max_batch=self.job.max_batch)
            prepared = self.steps.refined(prepared, [o.token_ids for o in outputs])
        return prepared


def collect(stream: Iterator[Chunks], num_texts: int) -> list[np.ndarray]:
    """A stream's chunks joined per text (float32)."""
    parts: list[list[np.ndarray]] = [[] for _ in range(num_texts)]
    for chunks in stream:
        for text, chunk in zip(parts, chunks, strict=True):
            text.append(chunk)
    return [p[0] if len(p) == 1 else np.concatenate(p).astype(np.float32) if p else np.zeros(0, np.float32)
            for p in parts]

