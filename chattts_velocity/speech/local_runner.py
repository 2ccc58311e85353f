"""The local runner: a job's GPT work on the pipeline's own GPTBackend, one call at a time (its CallGate).

What Chat, the web UI, the export and the CLI run on. The job is prepared when it is made (its texts checked
before the call waits for its turn); its refine pass and code pass run in the call's turn on the caller's thread
(`astream` / `arun`: on a worker thread, the awaiting side cancels the job when it stops waiting).
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import numpy as np

from ..audio import Spoken, piece_timestamps
from .calls import PerTextRequests, Stop
from .prepare import PreparedJob
from .streams import StreamSet, stream_texts
from .synthesis import AudioStream, Chunks, Result, Synthesis, collect

_DONE = object()  # the end of an async stream's queue


class LocalRunner:
    def prepare_now(self, synthesis: Synthesis) -> PreparedJob | None:
        """The job made ready now (each() prepares its own per-text requests when it runs)."""
        return None if synthesis.job.shape == "each" else synthesis.stages.prepare(synthesis.job)

    def run(self, synthesis: Synthesis) -> list[np.ndarray] | list[str]:
        if synthesis.job.refine_only:
            with synthesis.stages.gate.call(synthesis.stop_flag()) as stop:
                return self.ready(synthesis, stop).refined_texts()
        return collect(self.stream(synthesis), len(synthesis.job.texts))

    def stream(self, synthesis: Synthesis) -> Iterator[Chunks]:
        job, stages = synthesis.job, synthesis.stages
        with stages.gate.call(synthesis.stop_flag()) as stop:
            prepared = self.ready(synthesis, stop)
            if prepared.requests is None:
                raise RuntimeError("stream: a prepared job without code requests (refine_only)")
            gpt = stages.gpt(job.gpt)
            if job.shape == "chunks":
                yield from stream_texts(StreamSet(synthesis.chunking), gpt, prepared.requests, prepared.mel, stop)
                return
            outputs = gpt.generate(prepared.requests.prompts, prepared.requests.sampling, job.shows_progress(),
                                   stop, max_batch=job.max_batch)
            yield [np.concatenate(g).astype(np.float32) if g else np.zeros(0, np.float32)
                   for g in prepared.requests.pieces.group(prepared.mel.decode(outputs))]

    def each(self, synthesis: Synthesis) -> Iterator[tuple[int, Result]]:
        job, stages = synthesis.job, synthesis.stages
        requests = stages.each_requests(job)
        yield from requests.failed
        with stages.gate.call(synthesis.stop_flag()) as stop:
            yield from self._each(synthesis, requests, stop)

    async def arun(self, synthesis: Synthesis) -> list[np.ndarray] | list[str]:
        if synthesis.job.refine_only:
            try:
                return await asyncio.to_thread(self.run, synthesis)
            except asyncio.CancelledError:
                synthesis.cancel()
                raise
        return collect([c async for c in self.astream(synthesis)], len(synthesis.job.texts))

    async def astream(self, synthesis: Synthesis) -> AsyncIterator[Chunks]:
        loop, queue = asyncio.get_running_loop(), asyncio.Queue[object]()

        def produce() -> None:
            try:
                for chunks in self.stream(synthesis):
                    loop.call_soon_threadsafe(queue.put_nowait, chunks)
                    if synthesis.cancelled.is_set():
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
            synthesis.cancel()
            await asyncio.shield(worker)

    async def open(self, synthesis: Synthesis) -> AudioStream:
        raise RuntimeError("open: a one-track audio stream is the server's (its engine runner); use astream()")

    def ready(self, synthesis: Synthesis, stop: Stop) -> PreparedJob:
        """The prepared job with its pending refine pass run on its GPT backend, in the call's turn."""
        job, stages = synthesis.job, synthesis.stages
        prepared = synthesis.prepared
        if prepared is None:
            raise RuntimeError("run: a job of shape 'each' has no prepared requests")
        while (work := prepared.pending) is not None:
            outputs = stages.gpt(job.gpt).generate(work.prompts, work.sampling, work.progress, stop,
                                                        max_batch=job.max_batch)
            prepared = stages.refined(prepared, [o.token_ids for o in outputs])
        if job.refine is not None:
            synthesis.refined = prepared.refined_texts()
        return prepared

    def _each(self, synthesis: Synthesis, requests: PerTextRequests, stop: Stop) -> Iterator[tuple[int, Result]]:
        """(text index, its waveform) as each text finishes (with `timestamps`, a Spoken with each piece's span);
        a text whose generation failed yields its error instead."""
        job = synthesis.job
        for k, output in synthesis.stages.gpt(job.gpt).generate_iter(requests.prompts, requests.sampling,
                                                                          bool(job.progress), stop):
            for i, outputs in requests.done(k, output):
                if isinstance(outputs, Exception):
                    yield i, outputs
                    continue
                waves = requests.mel.decode(outputs)
                wav = np.concatenate(waves).astype(np.float32)
                texts = requests.pieces.of_text(i).texts
                yield i, Spoken(wav, piece_timestamps(texts, [len(w) for w in waves])) if job.timestamps else wav
