"""Serving stage: the engine runner — the GPT work of many jobs at once on one AsyncLLMEngine.

A server job (speech/synthesis.py's Synthesis on this runner) is prepared on the server's text workers (text_work.py:
splitting in a worker process for long texts, fair turns between clients), its refine pass runs on the shared engine
(every piece at once), then its pieces' code requests start a window at a time as its reader asks for audio
(`SpeechStream`). One decode thread (decode_worker.py) batches the due windows of every live stream into one
Decoder + Vocos call.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import NoReturn

import numpy as np
import torch

from ..audio.timestamps import Timeline
from ..engine.async_engine import AsyncLLMEngine, RequestStream
from ..schema import Prompt, SamplingParams
from ..speech.mel_source import MelSource
from ..speech.prepare import PreparedJob, TextGeneration
from ..speech.script_audio import piece_silences, silence_chunks
from ..speech.streams import EMPTY, StreamOptions, StreamSet
from ..speech.synthesis import Chunks, Result, Synthesis, collect
from .decode_worker import END, DecodeWorker, Item, sink_to
from .text_work import TextWorker


class EngineRunner:
    """Jobs on one AsyncLLMEngine, their windows decoded together; the async verbs only (arun, astream, open). A job's
    cancel() is called on the runner's event loop."""

    def __init__(self, engine: AsyncLLMEngine, options: StreamOptions | None = None,
                 text: TextWorker | None = None) -> None:
        self.engine = engine
        self.text = text or TextWorker()  # normalising and tokenising run here, never on the event loop
        self.worker = DecodeWorker(StreamSet(options or StreamOptions()))
        self._keys = itertools.count()

    def prepare_now(self, synthesis: Synthesis) -> PreparedJob | None:
        return None  # prepared in open(), on the text workers

    async def prepare(self, synthesis: Synthesis) -> PreparedJob:
        """The job made ready off the event loop (a long text split in a worker process), its pending refine pass
        run on the shared engine, every piece at once (its texts then in synthesis.refined)."""
        stages, job = synthesis.stages, synthesis.job
        pieces = await self.text.split(stages, job)
        prepared = await self.text.run(stages.prepare, job, pieces)
        while (work := prepared.pending) is not None:
            prepared = await self.text.run(stages.refined, prepared, await self._generate(work))
        if job.refine is not None:
            synthesis.refined = prepared.refined_texts()
        return prepared

    async def open(self, synthesis: Synthesis) -> SpeechStream:
        """The job prepared, its pieces checked against the engine and its first window started."""
        job = synthesis.job
        stream = SpeechStream(self, time.perf_counter(), job.first_chunk_samples, job.window)
        synthesis.on_cancel.append(stream.close)
        try:
            prepared = await self.prepare(synthesis)
            if prepared.requests is None:
                raise RuntimeError("open: a prepared job without code requests")
            requests = prepared.requests
            for piece, prompt, sampling, owner in zip(requests.pieces.texts, requests.prompts, requests.sampling,
                                                      requests.pieces.owner, strict=True):
                stream.add(piece, prompt, sampling, prepared.mel, owner)
            if job.script is not None:
                stream.silences = piece_silences(job.script, requests.pieces.owner)
            await stream.start_window(0)
        except BaseException:
            stream.close()
            raise
        return stream

    async def astream(self, synthesis: Synthesis) -> AsyncIterator[Chunks]:
        """open()'s chunks, each in its text's place (shape "whole": every text's clip in one yield at the end)."""
        stream = await self.open(synthesis)
        texts = len(synthesis.job.texts)
        try:
            if synthesis.job.shape == "whole":
                parts: list[Chunks] = []
                async for text, chunk in stream.by_text():
                    parts.append([chunk if t == text else EMPTY for t in range(texts)])
                yield collect(parts, texts)
                return
            async for text, chunk in stream.by_text():
                yield [chunk if t == text else EMPTY for t in range(texts)]
        finally:
            stream.close()

    async def arun(self, synthesis: Synthesis) -> list[np.ndarray] | list[str]:
        if synthesis.job.refine_only:
            return (await self.prepare(synthesis)).refined_texts()
        return collect([chunks async for chunks in self.astream(synthesis)], len(synthesis.job.texts))

    def run(self, synthesis: Synthesis) -> NoReturn:
        raise RuntimeError("run: the engine runner's jobs run on its event loop; await arun()")

    def stream(self, synthesis: Synthesis) -> NoReturn:
        raise RuntimeError("stream: the engine runner's jobs run on its event loop; use astream() or open()")

    def each(self, synthesis: Synthesis) -> Iterator[tuple[int, Result]]:
        raise RuntimeError("each: the engine runner has no per-text results; use the local runner")

    def new_key(self) -> str:
        """A request id no other stream of this runner has."""
        return f"speech-{next(self._keys)}"

    def shutdown(self) -> None:
        self.worker.shutdown()
        self.text.shutdown()

    async def _generate(self, work: TextGeneration) -> list[torch.Tensor]:
        """Each prompt's generated token ids [T, 1], in order."""
        tasks = [asyncio.ensure_future(self._text_ids(prompt, work.sampling)) for prompt in work.prompts]
        try:
            return list(await asyncio.gather(*tasks))
        finally:  # one failed (or the caller left): abort the others' engine requests
            for task in tasks:
                task.cancel()

    async def _text_ids(self, prompt: Prompt, sampling: SamplingParams) -> torch.Tensor:
        rows = [delta.token_ids async for delta in self.engine.generate(prompt, sampling)]
        return torch.cat(rows) if rows else torch.zeros(0, 1, dtype=torch.long)  # [T, 1]


class SpeechStream:
    """A server job's audio as one track: `async for chunk in stream` yields float32 chunks in order; close() aborts
    the rest. NOTE: with a `window`, piece i + window - 1 starts when the reader asks for more after piece i - 1's
    last chunk (HTTP flow control stops asking while its client does not read): a stalled reader holds at most
    `window` pieces. Only the first window can be refused for the client's unfinished pieces (ClientBusy)."""

    def __init__(self, runner: EngineRunner, started: float, first_chunk_samples: int = 0,
                 window: int | None = None) -> None:
        self.runner, self.started, self.first_chunk_samples = runner, started, first_chunk_samples
        self.window = window  # pieces in the engine at once, from the one being read; None: every piece
        self.first_audio: float | None = None  # seconds from open() to the first chunk
        self.timeline = Timeline()  # a Timestamp per piece whose audio has all been yielded
        self.input_tokens = 0  # prompt rows of every piece (text tokens, speaker and audio-prompt rows)
        self.output_tokens = 0  # code steps generated so far, every piece
        self.silences: dict[int, int] = {}  # piece index -> samples of silence before it (a script's pauses)
        self._pieces: list[tuple[str, Prompt, SamplingParams, MelSource, int]] = []  # ..., the piece's text
        self._keys: list[str] = []  # [started pieces]
        self._queues: list[asyncio.Queue[Item]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    def add(self, text: str, prompt: Prompt, sampling: SamplingParams, mel: MelSource, owner: int = 0) -> None:
        self.runner.engine.check(prompt, sampling)  # a piece too long for the engine: a ValueError before any audio
        self._pieces.append((text, prompt, sampling, mel, owner))
        self.input_tokens += len(prompt.input_ids)

    def usage(self) -> dict[str, int]:
        """Token counts in OpenAI's shape (the SSE done event's `usage`)."""
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "total_tokens": self.input_tokens + self.output_tokens}

    async def start_window(self, reading: int) -> None:
        """Start the pieces up to `window` past piece `reading` (all with no window)."""
        end = len(self._pieces) if self.window is None else min(reading + self.window, len(self._pieces))
        while len(self._keys) < end and not self._closed:
            (_, prompt, sampling, mel, _), key = self._pieces[len(self._keys)], self.runner.new_key()
            request = await self.runner.engine.add_request(prompt, sampling, key, capped=reading == 0)
            chunks: asyncio.Queue[Item] = asyncio.Queue()
            self.runner.worker.open(key, mel, sink_to(asyncio.get_running_loop(), chunks), self.first_chunk_samples)
            self._keys.append(key)
            self._queues.append(chunks)
            self._tasks.append(asyncio.create_task(self._feed(key, request, mel, chunks)))

    async def _feed(self, key: str, request: RequestStream, mel: MelSource, chunks: asyncio.Queue[Item]) -> None:
        try:
            async for delta in self.runner.engine.outputs(request):
                self.output_tokens += len(delta.token_ids)
                rows = mel.rows(delta) if len(delta.token_ids) else None
                self.runner.worker.push(key, rows, delta.finished)
        except Exception as exc:  # noqa: BLE001 -- surfaces in the consumer, in order
            chunks.put_nowait(exc)

    async def __aiter__(self) -> AsyncIterator[np.ndarray]:
        items = self.by_text()
        try:
            async for _, chunk in items:
                yield chunk
        finally:
            await items.aclose()

    async def by_text(self) -> AsyncGenerator[tuple[int, np.ndarray], None]:
        """(the text it belongs to, chunk) in order; a pause counts as the next piece's text (the last text's after
        the last piece)."""
        last = self._pieces[-1][4] if self._pieces else 0
        try:
            for reading, (text, *_, owner) in enumerate(self._pieces):
                for silence in self._silence(reading):
                    yield owner, silence
                await self.start_window(reading)
                if reading == len(self._queues):
                    return  # closed meanwhile
                chunks, samples = self._queues[reading], 0
                while (item := await chunks.get()) is not END:
                    if isinstance(item, BaseException):
                        raise item
                    if self.first_audio is None:
                        self.first_audio = time.perf_counter() - self.started
                    samples += len(item)
                    yield owner, item
                if self._closed:
                    return  # closed while this piece was being read: it ends with what it had
                self.timeline.add(text, samples)
            for silence in self._silence(len(self._pieces)):
                yield last, silence
        finally:
            self.close()

    def _silence(self, before: int) -> Iterator[np.ndarray]:
        """The pause before piece `before` (len(pieces): after the last), counted into the timeline."""
        samples = self.silences.get(before, 0)
        self.timeline.pause(samples)
        yield from silence_chunks(samples)

    def close(self) -> None:
        """Abort the pieces still generating (cancelling a feeder aborts its engine request); start no more; a
        reader ends after the chunks it already has. Call it on the stream's event loop."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for key in self._keys:
            self.runner.worker.drop(key)
        for chunks in self._queues:
            chunks.put_nowait(END)
