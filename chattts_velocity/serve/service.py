"""Serving stage: SpeechService — many concurrent texts on one AsyncLLMEngine, audio streamed per text.

In: text + InferCodeParams per HTTP request. Out: float32 24 kHz chunks in order (speech.StreamSet semantics).
One decode thread batches the due windows of every live stream into one Decoder + Vocos call.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..audio.timestamps import Timeline
from ..engine.async_engine import AsyncLLMEngine, RequestStream
from ..params import InferCodeParams, RefineTextParams
from ..schema import Prompt, SamplingParams, TextPieces
from ..speech.mel_source import MelSource
from ..speech.pipeline import SpeechPipeline
from ..speech.streams import EMPTY, StreamOptions, StreamSet
from .text_work import TextWorker, at_most

logger = logging.getLogger("chattts_velocity.serve")
_END = object()  # a stream's last item on a chunk queue

Sink = Callable[[object], None]  # receives np.ndarray chunks, then _END (or an exception)


@dataclass
class _Open:
    key: str
    mel: MelSource
    sink: Sink
    first_chunk_samples: int


@dataclass
class _Push:
    key: str
    rows: torch.Tensor | None  # [n, C]
    finished: bool


@dataclass
class _Drop:
    key: str


class DecodeWorker:
    """A thread that owns a StreamSet: rows pushed by many requests are decoded together, chunks go to sinks.

    NOTE: only this thread touches the StreamDecoders. While it decodes one batch the next round's rows
    pile up in the inbox, so the busier the server, the more windows share one Decoder + Vocos call.
    """

    def __init__(self, streams: StreamSet[str]) -> None:
        self.streams = streams
        self.max_batch = 0  # most streams that got audio from one batched decode
        self._inbox: queue.SimpleQueue[_Open | _Push | _Drop | None] = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._thread = threading.Thread(target=self._loop, name="chattts-decode", daemon=True)
        self._thread.start()

    def open(self, key: str, mel: MelSource, sink: Sink, first_chunk_samples: int = 0) -> None:
        self._inbox.put(_Open(key, mel, sink, first_chunk_samples))

    def push(self, key: str, rows: torch.Tensor | None, finished: bool) -> None:
        self._inbox.put(_Push(key, rows, finished))

    def drop(self, key: str) -> None:
        self._inbox.put(_Drop(key))

    def shutdown(self, timeout: float = 30.0) -> None:
        self._inbox.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            messages = [self._inbox.get()]
            while not self._inbox.empty():
                messages.append(self._inbox.get())
            if None in messages:
                return
            try:
                rows, ended = self._apply(messages)
                if rows or ended:
                    self._decode(rows, ended)
            except Exception:  # noqa: BLE001 -- a bug here must not silence every other stream
                logger.exception("decode worker: round failed")

    def _apply(self, messages: list) -> tuple[dict[str, torch.Tensor], list[str]]:
        rows: dict[str, list[torch.Tensor]] = {}
        ended: list[str] = []
        for m in messages:
            if isinstance(m, _Open):
                try:
                    self.streams.open(m.key, m.mel, m.first_chunk_samples)
                    self._sinks[m.key] = m.sink
                except ValueError as exc:
                    m.sink(exc)
            elif isinstance(m, _Drop):
                self.streams.drop(m.key)
                self._sinks.pop(m.key, None)
                rows.pop(m.key, None)
                ended = [k for k in ended if k != m.key]
            elif m.key in self._sinks:
                if m.rows is not None and len(m.rows):
                    rows.setdefault(m.key, []).append(m.rows)
                if m.finished:
                    ended.append(m.key)
        return {k: torch.cat(v) for k, v in rows.items()}, ended

    def _decode(self, rows: dict[str, torch.Tensor], ended: list[str]) -> None:
        # Streams still waiting for their first audio go first, in their own (small) batch, so a request
        # that just joined does not wait behind the steady windows of everyone else.
        fresh = {k: r for k, r in rows.items() if self.streams.streams[k].emitted_samples == 0}
        steady = {k: r for k, r in rows.items() if k not in fresh}
        for group in (fresh, steady):
            if group:
                self._run(list(group), lambda g=group: self.streams.push(g))
        ended = [k for k in ended if k in self._sinks]  # not failed above
        if ended:
            self._run(ended, lambda: self.streams.finish(ended))
        for key in ended:
            if key in self._sinks:
                self._sinks.pop(key)(_END)

    def _run(self, keys: list[str], decode: Callable[[], dict[str, np.ndarray]]) -> None:
        """One batched decode; chunks (or the error) go to the keys' sinks."""
        try:
            with torch.inference_mode():
                chunks = decode()
        except Exception as exc:  # noqa: BLE001 -- the requests involved get the error, the worker lives on
            for key in keys:
                self.streams.drop(key)
                self._sinks.pop(key, lambda _: None)(exc)
            return
        self.max_batch = max(self.max_batch, sum(len(c) > 0 for c in chunks.values()))
        for key, chunk in chunks.items():
            if len(chunk):
                self._sinks[key](chunk)


class SpeechService:
    """Many concurrent texts on one AsyncLLMEngine; each text's audio streams as its pieces are generated."""

    def __init__(self, pipeline: SpeechPipeline, engine: AsyncLLMEngine, options: StreamOptions | None = None,
                 text: TextWorker | None = None) -> None:
        self.pipeline, self.engine, self.options = pipeline, engine, options or StreamOptions()
        self.text = text or TextWorker()  # normalising and tokenising run here, never on the event loop
        self.worker = DecodeWorker(StreamSet(self.options))
        self._keys = itertools.count()

    def pieces(self, text: str, *, lang: str | None = None, normalize: bool = True, split: bool = True,
               max_pieces: int | None = None) -> TextPieces:
        """The text's normalised sentence pieces, at most max_pieces of them (a ValueError naming `input`)."""
        pieces = self.pipeline.frontend.pieces(text, lang=lang, normalize=normalize, homophones=normalize, split=split)
        return at_most(pieces, max_pieces)

    async def text_pieces(self, text: str, *, lang: str | None = None, normalize: bool = True, split: bool = True,
                          max_pieces: int | None = None) -> TextPieces:
        """pieces(), off the event loop (serve/text_work.py)."""
        pieces = await self.text.split(self.pipeline.frontend, text, lang=lang, normalize=normalize, split=split)
        return at_most(pieces, max_pieces)

    async def refine(self, pieces: TextPieces, params: RefineTextParams) -> TextPieces:
        """The refine-text pass on the shared engine: every piece at once, as Chat.infer's refine does."""
        prompts, sampling = await self.text.run(self.pipeline.frontend.refine_requests, pieces, params)
        tasks = [asyncio.ensure_future(self._text_ids(prompt, sampling)) for prompt in prompts]
        try:
            refined = await asyncio.gather(*tasks)
        finally:  # one failed (or the caller left): abort the others' engine requests
            for task in tasks:
                task.cancel()
        frontend = self.pipeline.frontend
        return pieces.replace(await self.text.run(lambda: [frontend.refined_text(ids) for ids in refined]))

    async def _text_ids(self, prompt: Prompt, sampling: SamplingParams) -> torch.Tensor:
        rows = [delta.token_ids async for delta in self.engine.generate(prompt, sampling)]
        return torch.cat(rows) if rows else torch.zeros(0, 1, dtype=torch.long)  # [T, 1]

    async def open(self, text: str, params: InferCodeParams, mel: MelSource | None = None,
                   refine: RefineTextParams | None = None, first_chunk_samples: int = 0, window: int | None = None,
                   **text_options: object) -> SpeechStream:
        """Queue the pieces of text on the engine (after the refine pass if `refine`; all, or `window` at a time as
        SpeechStream reads), audio from `mel` (default: the Decoder), each piece's first chunk at least
        first_chunk_samples long (StreamSet.open); text_options are text_pieces()'s. Bad input: ValueError, here."""
        mel = mel or self.pipeline.mel()
        stream = SpeechStream(self, time.perf_counter(), first_chunk_samples, window)
        try:
            pieces = await self.text_pieces(text, **text_options)
            if refine is not None:
                pieces = await self.refine(pieces, refine)
            requests = await self.text.run(self.pipeline.code_requests, pieces, params, mel)
            for piece, prompt, sampling in zip(pieces.texts, requests.prompts, requests.sampling, strict=True):
                stream.add(piece, prompt, sampling, mel)
            await stream.start_window(0)
        except BaseException:
            stream.close()
            raise
        return stream

    async def synthesize(self, text: str, params: InferCodeParams, **options: object) -> np.ndarray:
        """The whole waveform of text (the concatenation of its stream)."""
        stream = await self.open(text, params, **options)
        chunks = [chunk async for chunk in stream]
        return np.concatenate(chunks).astype(np.float32) if chunks else EMPTY

    def new_key(self) -> str:
        """A request id no other stream of this service has."""
        return f"speech-{next(self._keys)}"

    def shutdown(self) -> None:
        self.worker.shutdown()
        self.text.shutdown()


class SpeechStream:
    """One text's audio: `async for chunk in stream` yields float32 chunks in order; close() aborts the rest. NOTE:
    with a `window`, piece i + window - 1 starts when the reader asks for more after piece i - 1's last chunk (HTTP
    flow control stops asking while its client does not read): a stalled reader holds at most `window` pieces."""

    def __init__(self, service: SpeechService, started: float, first_chunk_samples: int = 0,
                 window: int | None = None) -> None:
        self.service, self.started, self.first_chunk_samples = service, started, first_chunk_samples
        self.window = window  # pieces in the engine at once, from the one being read; None: every piece
        self.first_audio: float | None = None  # seconds from open() to the first chunk
        self.timeline = Timeline()  # a Timestamp per piece whose audio has all been yielded
        self._pieces: list[tuple[str, Prompt, SamplingParams, MelSource]] = []
        self._keys: list[str] = []  # [started pieces]
        self._queues: list[asyncio.Queue] = []
        self._tasks: list[asyncio.Task] = []
        self._closed = False

    def add(self, text: str, prompt: Prompt, sampling: SamplingParams, mel: MelSource) -> None:
        self.service.engine.check(prompt, sampling)  # a piece too long for the engine: a ValueError before any audio
        self._pieces.append((text, prompt, sampling, mel))

    async def start_window(self, reading: int) -> None:
        """Start the pieces up to `window` past piece `reading` (all with no window). Only the first window can be
        refused for the client's unfinished pieces (ClientBusy): later ones belong to an accepted request."""
        end = len(self._pieces) if self.window is None else min(reading + self.window, len(self._pieces))
        while len(self._keys) < end and not self._closed:
            (_, prompt, sampling, mel), key = self._pieces[len(self._keys)], self.service.new_key()
            request = await self.service.engine.add_request(prompt, sampling, key, capped=reading == 0)
            chunks: asyncio.Queue = asyncio.Queue()
            self.service.worker.open(key, mel, _sink(asyncio.get_running_loop(), chunks), self.first_chunk_samples)
            self._keys.append(key)
            self._queues.append(chunks)
            self._tasks.append(asyncio.create_task(self._feed(key, request, mel, chunks)))

    async def _feed(self, key: str, request: RequestStream, mel: MelSource, chunks: asyncio.Queue) -> None:
        try:
            async for delta in self.service.engine.outputs(request):
                rows = mel.rows(delta) if len(delta.token_ids) else None
                self.service.worker.push(key, rows, delta.finished)
        except Exception as exc:  # noqa: BLE001 -- surfaces in the consumer, in order
            chunks.put_nowait(exc)

    async def __aiter__(self) -> AsyncIterator[np.ndarray]:
        try:
            for reading, (text, *_) in enumerate(self._pieces):
                await self.start_window(reading)
                if reading == len(self._queues):
                    return  # closed meanwhile
                chunks, samples = self._queues[reading], 0
                while (item := await chunks.get()) is not _END:
                    if isinstance(item, BaseException):
                        raise item
                    if self.first_audio is None:
                        self.first_audio = time.perf_counter() - self.started
                    samples += len(item)
                    yield item
                self.timeline.add(text, samples)
        finally:
            self.close()

    def close(self) -> None:
        """Abort the pieces still generating (cancelling a feeder aborts its engine request); start no more."""
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for key in self._keys:
            self.service.worker.drop(key)


def _sink(loop: asyncio.AbstractEventLoop, chunks: asyncio.Queue) -> Sink:
    """Hand items from the decode thread to a queue on the consumer's loop."""
    def put(item: object) -> None:
        try:
            loop.call_soon_threadsafe(chunks.put_nowait, item)
        except RuntimeError:  # the consumer's loop is closed: nobody is listening any more
            pass
    return put
