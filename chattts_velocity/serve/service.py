"""Serving stage: SpeechService — the server's speech requests as jobs on one engine runner.

In: text + InferCodeParams per HTTP request (or a script's turns, each with its params). Out: the job's audio as one
track of float32 24 kHz chunks in order (`Synthesis.open()`: an AudioStream). Each request is one SynthesisJob run
through `SpeechPipeline.synthesis(job, runner)` on the service's EngineRunner (serve/engine_runner.py: text work on
the server's text workers, the refine pass and every piece on the shared AsyncLLMEngine, one decode thread).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..engine.async_engine import AsyncLLMEngine
from ..params import InferCodeParams, RefineTextParams
from ..schema import TextPieces
from ..speech.job import SynthesisJob, TextOptions
from ..speech.pipeline import SpeechPipeline
from ..speech.prepare import PreparedJob
from ..speech.streams import EMPTY, StreamOptions
from ..speech.synthesis import AudioStream, Synthesis
from ..text.script import Script
from .decode_worker import DecodeWorker
from .engine_runner import EngineRunner
from .text_work import PieceOptions, TextWorker

if TYPE_CHECKING:
    from typing_extensions import Unpack


class SpeechService:
    """Many concurrent jobs on one AsyncLLMEngine; each job's audio streams as its pieces are generated."""

    def __init__(self, pipeline: SpeechPipeline, engine: AsyncLLMEngine, options: StreamOptions | None = None,
                 text: TextWorker | None = None) -> None:
        self.pipeline, self.engine = pipeline, engine
        self.runner = EngineRunner(engine, options, text)

    @property
    def text(self) -> TextWorker:
        """The text workers every request's text work runs on (SSML, voices, normalising, tokenising)."""
        return self.runner.text

    @property
    def worker(self) -> DecodeWorker:
        """The decode thread shared by every job's windows."""
        return self.runner.worker

    def job(self, text: str | list[str], params: InferCodeParams | list[InferCodeParams], mel: str = "decoder",
            refine: RefineTextParams | None = None, first_chunk_samples: int = 0, window: int | None = None,
            script: Script | None = None, **text_options: Unpack[PieceOptions]) -> SynthesisJob:
        """One request's text (or a script's turns, each with its params) as a job: its steps capped by the
        request's params (ServerConfig.max_new_token), homophones replaced when the text is normalised, its first
        chunk at least first_chunk_samples long, `window` pieces in the engine at once (None: all)."""
        normalize = text_options.get("normalize", True)
        texts = script.texts if script is not None else [text] if isinstance(text, str) else text
        return SynthesisJob(texts, params, mel=mel, refine=refine, gpt="velocity", weights_step_cap=False,
                            text=TextOptions(text_options.get("lang"), normalize, normalize,
                                             text_options.get("split", True)),
                            max_pieces=text_options.get("max_pieces"), shape="chunks",
                            first_chunk_samples=first_chunk_samples, window=window, script=script)

    def synthesis(self, job: SynthesisJob) -> Synthesis:
        """The job on this service's engine runner."""
        return self.pipeline.synthesis(job, runner=self.runner)

    def pieces(self, text: str, **text_options: Unpack[PieceOptions]) -> TextPieces:
        """The text's normalised sentence pieces, as open() speaks them (before a refine pass)."""
        return self.pipeline.stages.pieces(self.job(text, InferCodeParams(), **text_options))

    async def prepare(self, job: SynthesisJob) -> PreparedJob:
        """The job made ready as open() makes it (text work, then its refine pass on the engine)."""
        return await self.runner.prepare(self.synthesis(job))

    async def open(self, text: str | list[str], params: InferCodeParams | list[InferCodeParams],
                   mel: str = "decoder", refine: RefineTextParams | None = None, first_chunk_samples: int = 0,
                   window: int | None = None, script: Script | None = None,
                   **text_options: Unpack[PieceOptions]) -> AudioStream:
        """job(...) opened: prepared and its first window started; bad input is a ValueError, here."""
        return await self.synthesis(self.job(text, params, mel, refine, first_chunk_samples, window, script,
                                             **text_options)).open()

    async def synthesize(self, text: str, params: InferCodeParams, mel: str = "decoder",
                         refine: RefineTextParams | None = None, first_chunk_samples: int = 0,
                         **text_options: Unpack[PieceOptions]) -> np.ndarray:
        """The whole waveform of text (the concatenation of its stream)."""
        stream = await self.open(text, params, mel, refine, first_chunk_samples, **text_options)
        chunks = [chunk async for chunk in stream]
        return np.concatenate(chunks).astype(np.float32) if chunks else EMPTY

    def shutdown(self) -> None:
        self.runner.shutdown()
