"""Serving stage: the OpenAI-compatible speech API (FastAPI) over one SpeechService.

POST /v1/audio/speech, its WebSocket (serve/ws_speech.py), /v1/models, /health, /metrics, and /v1/audio/voices; errors
in OpenAI's shape (serve/errors.py). The speech pipeline (or a loaded Chat's) and the AsyncLLMEngine are built in the
app's lifespan, so the same app object runs under uvicorn and under Ray Serve (one engine per replica).
"""
from __future__ import annotations

import asyncio
import gc
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import Response

from ..audio.encode import wav_bytes
from ..audio.formats import FORMATS, available_formats
from ..audio.loudness import check_loudness, normalize_loudness
from ..audio.wav import SAMPLE_RATE
from ..chat import Chat, pipeline_of
from ..engine.async_engine import AsyncLLMEngine
from ..params import InferCodeParams
from ..speech.pipeline import SpeechPipeline
from ..speech.script_audio import scripted
from ..speech.synthesis import AudioStream
from ..text.voices import VoiceLibrary
from . import metrics
from .audio_stream import StreamedAudio, encoded_chunks
from .cache import AudioCache, recorded
from .clients import Clients
from .edge import Edge
from .errors import add_error_handlers, count_error
from .free_text import report_headers
from .info_routes import add_info_routes
from .instructions import SpeechInput, code_params, speech_input
from .intake import Admission, ClientGone, unless_gone
from .openai_names import check_model
from .origin import BrowserGuard
from .request import (
    SpeechBody,
    api_error,
    bad_request,
    check_body,
    sampling_kwargs,
    streamed_response,
)
from .request_id import RequestId
from .server_config import API_KEY_ENV, ServerConfig  # noqa: F401 -- the names this module has always offered
from .service import SpeechService
from .sse import caption_field, sse_events
from .text_work import TextWorker
from .voice_fields import VoiceBook
from .voice_routes import VOICES_PATH, add_voice_routes
from .ws_speech import add_speech_ws_route

logger = logging.getLogger("chattts_velocity.serve")
Speech = SpeechPipeline | Chat  # what the app serves: a pipeline, or a loaded Chat's


class ServerState:
    """Everything a route needs, built once per process (or Ray Serve replica) in the lifespan."""

    def __init__(self, pipeline: SpeechPipeline, config: ServerConfig) -> None:
        self.pipeline, self.config = pipeline, config
        self.engine = AsyncLLMEngine(pipeline.stages.engine(), config.max_queued_per_client)
        self.service = SpeechService(pipeline, self.engine, config.stream_options,
                                     TextWorker(config.text_workers, config.text_budget_s, config.text_processes))
        self.library = VoiceLibrary(config.voices_dir, config.max_voices)
        self.voices = VoiceBook(pipeline.speakers.random, self.library)
        self.cache = AudioCache(config.cache_mb << 20)
        self.admission = Admission(self.engine, config.max_preparing_per_client)
        self.metrics = metrics.ServerMetrics(lambda: {**self.engine.metrics(),
                                                      metrics.DECODE_MAX_BATCH: self.service.worker.max_batch})
        self.formats = available_formats()
        self.engine.start()

    def shutdown(self) -> None:
        self.engine.shutdown()
        self.service.shutdown()

    async def warm_up(self, steps: int) -> None:
        """Run one short request end to end (first-call costs of the GEMMs and convolutions)."""
        if steps > 0:
            params = InferCodeParams(manual_seed=0, max_new_token=steps, min_new_token=steps, show_tqdm=False)
            await self.service.synthesize("Warm up.", params)

    def speech(self, body: SpeechBody) -> tuple[SpeechInput, InferCodeParams, str]:
        """The body's text, refine pass, code params and voice kind; a ValueError names the body's field.
        Runs on a text thread (SSML is read here). A speaker string is decoded once (text/speaker.py caches it by
        string), and checked against the model by the pipeline's text front end when the service builds the
        request."""
        sampling = sampling_kwargs(body, self.config.max_new_token)  # checked before any voice is drawn
        if body.loudness is not None:
            check_loudness(body.loudness)
            if streamed_response(body):  # `stream: true` or SSE asked for; by default loudness sends the whole body
                raise ValueError("loudness: is measured on the whole clip; ask for it with stream=false")
        voice = self.voices.params(body.voice)
        plan = speech_input(body.input, body.speed, body.instructions, sampling.get("manual_seed"),
                            self.config.strict_instructions)
        return plan, code_params(plan, voice, sampling), self.voices.kind(body.voice)

    async def observed(self, stream: AudioStream, labels: metrics.Labels) -> AsyncIterator[np.ndarray]:
        """The stream's chunks, counted into the metrics; an early exit (client gone) aborts the rest."""
        first, status = True, "disconnect"
        try:
            async for chunk in stream:
                if first and stream.first_audio is not None:  # the stream sets it before its first chunk
                    self.metrics.time_to_first_audio.labels(labels.format).observe(stream.first_audio)
                    first = False
                self.metrics.audio_seconds.labels(labels.format).inc(len(chunk) / SAMPLE_RATE)
                yield chunk
            status = "ok"
            self.metrics.request_seconds.labels(labels.format).observe(time.perf_counter() - stream.started)
        except Exception:
            status = "server_error"
            raise
        finally:
            stream.close()
            self.metrics.outcome(status, labels)

    async def open_speech(self, body: SpeechBody, fmt: str, streamed: bool,
                          request: Request) -> tuple[SpeechInput, AudioStream | Response, str | None]:
        """(plan, its stream or cached response, its cache key): text work, refine pass, first pieces."""
        plan, params, kind = await self.service.text.run(self.speech, body)
        script, turns = await self.service.text.run(scripted, plan.text, params, self.voices.params)
        request.state.labels = labels = metrics.Labels(fmt, kind)
        key, data = self.cached(body, plan, params, fmt, streamed) if script is None else (None, None)
        if data is not None:
            self.metrics.outcome("ok", labels)
            return plan, Response(data, media_type=FORMATS[fmt].media_type), key
        c = self.config
        first = FORMATS[fmt].first_chunk_samples if streamed else 0  # the encoder's first bytes leave with it
        stream = await self.service.open(plan.text, turns, refine=plan.refine, split=c.split_text,
                                         max_pieces=c.max_pieces, first_chunk_samples=first,
                                         window=c.stream_window_pieces if streamed else None, script=script)
        return plan, stream, key

    def cached(self, body: SpeechBody, plan: SpeechInput, params: InferCodeParams, fmt: str,
               streamed: bool) -> tuple[str | None, bytes | None]:
        """(the request's cache key or None, its cached bytes or None); SSE responses are not cached."""
        key = None if body.stream_format == "sse" else AudioCache.key(plan, params, fmt, body.loudness, streamed)
        data = self.cache.get(key)
        if key is not None and self.cache.budget > 0:
            self.metrics.cache.labels("miss" if data is None else "hit").inc()
        return key, data

    def reported(self, response: Response, plan: SpeechInput, request: Request) -> Response:
        """response with what the instructions applied and ignored in its headers (ignored clauses logged)."""
        response.headers.update(report_headers(plan.applied, plan.ignored))
        if plan.ignored:
            logger.info("speech request %s: instructions applied %s, ignored %s",
                        getattr(request.state, "request_id", "-"), list(plan.applied),
                        [clause[:80] for clause in plan.ignored])
        return response

    def encode(self, wav: np.ndarray, fmt: str, loudness: float | None) -> bytes:
        return wav_bytes(wav if loudness is None else normalize_loudness(wav, loudness), fmt=fmt)

    def audio_bytes(self, stream: AudioStream, labels: metrics.Labels) -> AsyncIterator[bytes]:
        return encoded_chunks(self.observed(stream, labels), labels.format)

    async def collect(self, stream: AudioStream, request: Request, labels: metrics.Labels) -> np.ndarray | None:
        """The whole clip, or None if the client disconnected first (the request is then aborted)."""
        async def gather() -> list[np.ndarray]:
            return [c async for c in self.observed(stream, labels)]

        try:
            chunks = await unless_gone(request, gather())
        except ClientGone:
            return None
        except Exception:
            request.state.counted = True  # observed() counted it; the 500 handler must not count it again
            raise
        return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


def create_app(speech: Speech | Callable[[], Speech], config: ServerConfig | None = None) -> FastAPI:
    """The API app. `speech` is a SpeechPipeline or a loaded Chat, or a zero-argument loader of either (called in
    the lifespan, off the loop)."""
    config = config or ServerConfig()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loaded = speech if isinstance(speech, (SpeechPipeline, Chat)) else await asyncio.to_thread(speech)
        app.state.server = ServerState(pipeline_of(loaded), config)
        try:
            await app.state.server.warm_up(config.warmup_steps)
            # The startup heap (torch, the model, the pipeline) stays out of the collector's full passes: over it a
            # full pass stalls the engine thread ~0.1 s every few hundred steps at 256 streams.
            gc.collect()
            gc.freeze()
            yield
        finally:
            gc.unfreeze()
            app.state.server.shutdown()

    app = FastAPI(title="chattts_velocity speech API", lifespan=lifespan)
    add_error_handlers(app)
    _add_speech_route(app, config)
    add_info_routes(app, config)
    add_voice_routes(app)
    clients = Clients(config.api_keys(), config.max_queued_per_client, config.trusted_proxies)
    add_speech_ws_route(app, config, clients)  # identified and authorized as the HTTP routes are
    app.add_middleware(Edge, api_key=None, clients=clients, max_body_bytes=config.max_body_bytes,
                       on_refuse=lambda: count_error(app, 400), path_limits={VOICES_PATH: config.max_upload_bytes},
                       body_timeout=config.body_timeout_s, body_budget=config.body_budget_bytes,
                       send_timeout=config.send_timeout_s)
    app.add_middleware(BrowserGuard, allowed_origins=config.allowed_origins, form_paths=(VOICES_PATH,),
                       on_refuse=lambda: count_error(app, 403))
    app.add_middleware(RequestId)  # added last: the outermost, so every response carries x-request-id
    return app


def _add_speech_route(app: FastAPI, config: ServerConfig) -> None:
    @app.post("/v1/audio/speech")
    async def create_speech(body: SpeechBody, request: Request) -> Response:
        state: ServerState = request.app.state.server
        state.metrics.requests.inc()
        fmt = check_body(body, config.max_input_chars, state.formats)
        request.state.labels = metrics.Labels(fmt)  # what an error response is counted under
        check_model(body.model, config.model_name)
        streamed = streamed_response(body)
        try:  # one admission point, then the preparation, cancelled if the client leaves (serve/intake.py)
            async with state.admission.admitted():
                plan, stream, key = await unless_gone(request, state.open_speech(body, fmt, streamed, request))
        except ClientGone:
            state.metrics.outcome("disconnect", request.state.labels)
            return Response(status_code=499)  # nobody reads it
        except ValueError as exc:
            raise bad_request(exc) from None
        except RuntimeError as exc:
            raise api_error(503, str(exc), kind="server_error", code="engine_unavailable") from None
        if isinstance(stream, Response):  # from the cache
            return state.reported(stream, plan, request)
        labels = request.state.labels
        if streamed:
            chunks = state.audio_bytes(stream, labels)
            if body.stream_format == "sse":
                timeline = stream.timeline if body.timestamps else None
                events = sse_events(chunks, timeline, stream.usage, caption_field(stream.timeline, body.captions))
                return state.reported(StreamedAudio(events, stream.close, media_type="text/event-stream"), plan,
                                      request)
            return state.reported(StreamedAudio(recorded(chunks, partial(state.cache.put, key)), stream.close,
                                                media_type=FORMATS[fmt].media_type), plan, request)
        wav = await state.collect(stream, request, labels)
        data = b"" if wav is None else await asyncio.to_thread(state.encode, wav, fmt, body.loudness)
        state.cache.put(key if wav is not None else None, data)
        return state.reported(Response(data, media_type=FORMATS[fmt].media_type), plan, request)


def run_server(speech: Speech | Callable[[], Speech], config: ServerConfig | None = None, host: str = "127.0.0.1",
               port: int = 8000, log_level: str = "info") -> None:
    """Serve the API with uvicorn (blocking). Binds loopback unless host says otherwise."""
    import uvicorn

    from .timeouts import header_timeout_protocol

    config = config or ServerConfig()
    if not logger.handlers:  # the server's own lines (instructions ignored, ...) beside uvicorn's, at its level
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(log_level.upper())
    uvicorn.run(create_app(speech, config), host=host, port=port, log_level=log_level,
                http=header_timeout_protocol(config.header_timeout_s, config.send_timeout_s),
                timeout_graceful_shutdown=math.ceil(config.shutdown_grace_s))
