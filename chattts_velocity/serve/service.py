"""Serving stage: SpeechService — many concurrent texts on one AsyncLLMEngine, audio streamed per text.

In: text + InferCodeParams per HTTP request, as a SynthesisJob. Out: float32 24 kHz chunks in order
(speech.StreamSet semantics). The job is prepared by the pipeline (SpeechPipeline.prepare: pieces, refine, code
requests); the service only runs the waiting on its engine (refine prompts, then each piece's code request, a
window at a time). One decode thread batches the due windows of every live stream into one Decoder + Vocos call.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..audio.timestamps import Timeline
from ..engine.async_engine import AsyncLLMEngine, RequestStream
from ..params import InferCodeParams, RefineTextParams
from ..schema import Prompt, SamplingParams, TextPieces
from ..speech.job import SynthesisJob, TextOptions
from ..speech.mel_source import MelSource
from ..speech.pipeline import SpeechPipeline
from ..speech.prepare import PreparedJob, TextGeneration
from ..speech.script_audio import piece_silences, silence_chunks
from ..speech.streams import EMPTY, StreamOptions, StreamSet
from ..text.script import Script
from .decode_worker import END, DecodeWorker, Item, sink_to
from .text_work import PieceOptions, TextWorker

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger("chattts_velocity.serve")


class SpeechService:
    """Many concurrent texts on one AsyncLLMEngine; each text's audio streams as its pieces are generated."""

    def __init__(self, pipeline: SpeechPipeline, engine: AsyncLLMEngine, options: StreamOptions | None = None,
                 text: TextWorker | None = None) -> None:
        self.pipeline, self.engine, self.options = pipeline, engine, options or StreamOptions()
        self.text = text or TextWorker()  # normalising and tokenising run here, never on the event loop
        self.worker = DecodeWorker(StreamSet(self.options))
        self._keys = itertools.count()

    def job(self, text: str | list[str], params: InferCodeParams | list[InferCodeParams], mel: str = "decoder",
            refine: RefineTextParams | None = None, **text_options: Unpack[PieceOptions]) -> SynthesisJob:
        """One request's text (or a script's turns, each with its params) as a pipeline job: on the velocity engine,
        its steps capped by the request's params (ServerConfig.max_new_token), homophones replaced when the text is
        normalised."""
        normalize = text_options.get("normalize", True)
        texts = [text] if isinstance(text, str) else text
        return SynthesisJob(texts, params, mel=mel, refine=refine, use_vllm=True, weights_step_cap=False,
                            text=TextOptions(text_options.get("lang"), normalize, normalize,
                                             text_options.get("split", True)),
                            max_pieces=text_options.get("max_pieces"))

    def pieces(self, text: str, **text_options: Unpack[PieceOptions]) -> TextPieces:
        """The text's normalised sentence pieces, as open() speaks them (before a refine pass)."""
        return self.pipeline.pieces(self.job(text, InferCodeParams(), **text_options))

    async def prepare(self, job: SynthesisJob) -> PreparedJob:
        """SpeechPipeline.prepare(job) off the event loop (a long text split in a worker process: text_work.py),
        its pending refine pass run on the shared engine, every piece at once."""
        pieces = await self.text.split(self.pipeline, job)
        prepared = await self.text.run(self.pipeline.prepare, job, pieces)
        while (work := prepared.pending) is not None:
            prepared = await self.text.run(self.pipeline.refined, prepared, await self._generate(work))
        return prepared

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

    async def open(self, text: str, params: InferCodeParams | list[InferCodeParams], mel: str = "decoder",
                   refine: RefineTextParams | None = None, first_chunk_samples: int = 0, window: int | None = None,
                   script: Script | None = None, **text_options: Unpack[PieceOptions]) -> SpeechStream:
        """Queue the pieces of text on the engine (after the refine pass if `refine`; all, or `window` at a time as
        SpeechStream reads), audio from the mel source named `mel`, each piece's first chunk at least
        first_chunk_samples long (StreamSet.open); text_options are job()'s. With a `script`, its turns are the
        texts (params: one per turn) and its pauses stream as silence between them. Bad input: ValueError, here."""
        stream = SpeechStream(self, time.perf_counter(), first_chunk_samples, window)
        try:
            texts = text if script is None else script.texts
            prepared = await self.prepare(self.job(texts, params, mel, refine, **text_options))
            if prepared.requests is None:
                raise RuntimeError("open: a prepared job without code requests")
            requests = prepared.requests
            for piece, prompt, sampling in zip(requests.pieces.texts, requests.prompts, requests.sampling,
                                               strict=True):
                stream.add(piece, prompt, sampling, prepared.mel)
            if script is not None:
                stream.silences = piece_silences(script, requests.pieces.owner)
            await stream.start_window(0)
        except BaseException:
            stream.close()
            raise
        return stream

    async def synthesize(self, text: str, params: InferCodeParams, mel: str = "decoder",
                         refine: RefineTextParams | None = None, first_chunk_samples: int = 0,
                         **text_options: Unpack[PieceOptions]) -> np.ndarray:
        """The whole waveform of text (the concatenation of its stream)."""
        stream = await self.open(text, params, mel, refine, first_chunk_samples, **text_options)
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
        self.input_tokens = 0  # prompt rows of every piece (text tokens, speaker and audio-prompt rows)
        self.output_tokens = 0  # code steps generated so far, every piece
        self._pieces: list[tuple[str, Prompt, SamplingParams, MelSource]] = []
        self._keys: list[str] = []  # [started pieces]
        self._queues: list[asyncio.Queue[Item]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self.silences: dict[int, int] = {}  # piece index -> samples of silence before it (a script's pauses)

    def add(self, text: str, prompt: Prompt, sampling: SamplingParams, mel: MelSource) -> None:
        self.service.engine.check(prompt, sampling)  # a piece too long for the engine: a ValueError before any audio
        self._pieces.append((text, prompt, sampling, mel))
        self.input_tokens += len(prompt.input_ids)

    def usage(self) -> dict[str, int]:
        """Token counts in OpenAI's shape (the SSE done event's `usage`)."""
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "total_tokens": self.input_tokens + self.output_tokens}

    async def start_window(self, reading: int) -> None:
        """Start the pieces up to `window` past piece `reading` (all with no window). Only the first window can be
        refused for the client's unfinished pieces (ClientBusy): later ones belong to an accepted request."""
        end = len(self._pieces) if self.window is None else min(reading + self.window, len(self._pieces))
        while len(self._keys) < end and not self._closed:
            (_, prompt, sampling, mel), key = self._pieces[len(self._keys)], self.service.new_key()
            request = await self.service.engine.add_request(prompt, sampling, key, capped=reading == 0)
            chunks: asyncio.Queue[Item] = asyncio.Queue()
            self.service.worker.open(key, mel, sink_to(asyncio.get_running_loop(), chunks), self.first_chunk_samples)
            self._keys.append(key)
            self._queues.append(chunks)
            self._tasks.append(asyncio.create_task(self._feed(key, request, mel, chunks)))

    async def _feed(self, key: str, request: RequestStream, mel: MelSource, chunks: asyncio.Queue[Item]) -> None:
        try:
            async for delta in self.service.engine.outputs(request):
                self.output_tokens += len(delta.token_ids)
                rows = mel.rows(delta) if len(delta.token_ids) else None
                self.service.worker.push(key, rows, delta.finished)
        except Exception as exc:  # noqa: BLE001 -- surfaces in the consumer, in order
            chunks.put_nowait(exc)

    async def __aiter__(self) -> AsyncIterator[np.ndarray]:
        try:
            for reading, (text, *_) in enumerate(self._pieces):
                for silence in self._silence(reading):
                    yield silence
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
                    yield item
                self.timeline.add(text, samples)
            for silence in self._silence(len(self._pieces)):
                yield silence
        finally:
            self.close()

    def _silence(self, before: int) -> Iterator[np.ndarray]:
        """The pause before piece `before` (len(pieces): after the last), counted into the timeline."""
        samples = self.silences.get(before, 0)
        self.timeline.pause(samples)
        yield from silence_chunks(samples)

    def close(self) -> None:
        """Abort the pieces still generating (cancelling a feeder aborts its engine request); start no more."""
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for key in self._keys:
            self.service.worker.drop(key)
