"""Serving stage: the speech WebSocket, /v1/audio/speech/ws — text in as it is written, audio out per sentence.

The client sends JSON text frames: first {"type": "config", ...} with the fields of POST /v1/audio/speech except
`input` (checked the same way: model, voice, speed, instructions, sampling, response_format), then any number of
{"type": "text", "text": "..."} deltas (a word may be split across them), then {"type": "flush"} (speak what is left;
answered by {"type": "done"} once spoken) and/or {"type": "close"} (flush, then the server closes the socket). The
server cuts complete sentences out of the deltas (text/sentence_stream.py), opens each on the shared engine at once
(serve/ws_session.py) and sends binary frames of audio in the configured format (the encoders of streaming HTTP; each
flush ends one file) with JSON frames {"type": "sentence.start", "index", "text", "start"} and {"type":
"sentence.end", "index", "text", "end"} (seconds of the session's audio). Errors are {"type": "error", "error":
{OpenAI's shape}}: a sentence that cannot be spoken is reported (with its "index") and the session goes on; a bad
config, a bad frame, the session's text limit, an idle session or a wrong API key end it (close code 1008, idle 1000).

Auth and identity are the HTTP routes' (serve/clients.py: Authorization: Bearer on a keyed server; a client is its
peer, with its key); at most ServerConfig.ws_sessions_per_client sessions per client at once (close code 1013); a
client that stops reading stalls its own session only, and after send_timeout_s the session is closed and its
engine requests aborted.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

from fastapi import FastAPI, WebSocket
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.websockets import WebSocketDisconnect

from ..audio.formats import FORMATS
from ..engine.async_engine import CLIENT, QUOTAS
from ..speech.synthesis import AudioStream
from ..text.sentence_stream import SentenceStream
from .clients import Clients
from .openai_names import check_model
from .request import SpeechBody, bad_request, check_body, error_detail, validation_detail
from .server_config import ServerConfig
from .ws_session import SentenceQueue, SessionError, error_frame

WS_PATH = "/v1/audio/speech/ws"
POLICY, TRY_LATER = 1008, 1013  # close codes: a refused session; too many sessions for this client
NOT_ON_WS = ("input", "stream", "stream_format", "timestamps", "captions", "loudness")  # config fields refused
logger = logging.getLogger("chattts_velocity.serve")


class _End(Exception):
    """End the session: send this error frame (if any) and close with this code."""

    def __init__(self, frame: str | None, code: int = POLICY) -> None:
        super().__init__(frame)
        self.frame, self.code = frame, code


def add_speech_ws_route(app: FastAPI, config: ServerConfig, clients: Clients) -> None:
    """The route on `app`; `clients` identifies and authorizes a connection as the HTTP edge does (serve/edge.py)."""
    seats: Counter[str] = Counter()  # open sessions per client
    app.state.ws_sessions = seats  # read by tests and operators

    @app.websocket(WS_PATH)
    async def speech_ws(websocket: WebSocket) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in websocket.scope.get("headers", [])}
        client = clients.identify(websocket.scope, headers)
        CLIENT.set(client.name)  # the engine's turns and quotas, as for HTTP requests
        QUOTAS.set(client.quotas)
        await websocket.accept()
        try:
            if not client.authorized:
                raise _End(error_frame("Incorrect API key provided; send 'Authorization: Bearer <key>'",
                                       code="invalid_api_key"))
            if seats[client.name] >= config.ws_sessions_per_client:
                raise _End(error_frame(f"session: this client holds {seats[client.name]} speech sessions, the most "
                                       "one client may hold at once; close one first", code="too_many_sessions"),
                           TRY_LATER)
            seats[client.name] += 1
            try:
                await Session(websocket, config).run()
            finally:
                seats[client.name] -= 1
        except _End as end:
            await _close(websocket, end.frame, end.code)
        except WebSocketDisconnect:
            pass


async def _close(websocket: WebSocket, frame: str | None, code: int) -> None:
    with suppress(Exception):  # the client may be gone or not reading: closing must not hang or raise
        if frame is not None:
            await asyncio.wait_for(websocket.send_text(frame), 5.0)
        await asyncio.wait_for(websocket.close(code), 5.0)


class Session:
    """One connection after auth: the config, then the receive loop beside the queue that speaks."""

    def __init__(self, websocket: WebSocket, config: ServerConfig) -> None:
        self.websocket, self.config = websocket, config
        self.state = websocket.app.state.server
        self.received = 0  # characters of text received

    async def run(self) -> None:
        body, fmt = await self._config()
        queue = SentenceQueue(lambda text: self._open(body, fmt, text), fmt, self._send_json, self._send_bytes,
                              self.config.stream_window_pieces, _detail)
        sentences = SentenceStream(self.config.max_input_chars)
        speaking = asyncio.create_task(queue.run())
        try:
            await self._receive(queue, sentences, speaking)
            await speaking  # a close: everything queued is spoken first
            await _close(self.websocket, None, 1000)
        finally:
            speaking.cancel()
            queue.close()
            with suppress(BaseException):
                await speaking

    async def _config(self) -> tuple[SpeechBody, str]:
        frame = await self._frame(idle_ok=False)
        if frame.get("type") != "config":
            raise _End(error_frame("type: the first frame must be {\"type\": \"config\", ...} with the speech "
                                   "fields except input", "type"))
        fields = {k: v for k, v in frame.items() if k != "type"}
        refused = sorted(set(fields) & set(NOT_ON_WS))
        if refused:
            raise _End(error_frame(f"{refused[0]}: not a WebSocket config field (text comes in text frames, audio "
                                   "in binary frames, sentence spans in sentence.start/end frames)", refused[0]))
        try:
            body = SpeechBody(input="Config check.", stream=True, **fields)
            fmt = check_body(body, self.config.max_input_chars, self.state.formats)
            check_model(body.model, self.config.model_name)
            await self.state.service.text.run(self.state.speech, body)  # voice, speed, instructions, sampling
        except ValidationError as exc:
            raise _End(json.dumps({"type": "error", "error": validation_detail(list(exc.errors()))})) from None
        except (HTTPException, ValueError) as exc:
            raise _End(json.dumps({"type": "error", "error": _detail(exc)})) from None
        return body, fmt

    async def _receive(self, queue: SentenceQueue, sentences: SentenceStream, speaking: asyncio.Task[None]) -> None:
        while not speaking.done():
            frame = await self._frame(idle_ok=queue.busy, speaking=speaking)
            if not frame:
                continue  # idle while speaking, or the queue ended
            kind = frame.get("type")
            if kind == "text":
                for sentence in self._text(frame, sentences):
                    queue.add(sentence)
            elif kind in ("flush", "close"):
                for sentence in sentences.flush():
                    queue.add(sentence)
                queue.flush(close=kind == "close")
                if kind == "close":
                    return
            else:
                raise _End(error_frame(f"type: {str(kind)[:40]!r} is not a frame type here; send text, flush or "
                                       "close", "type"))

    def _text(self, frame: dict[str, Any], sentences: SentenceStream) -> list[str]:
        text = frame.get("text")
        if not isinstance(text, str):
            raise _End(error_frame("text: a text frame is {\"type\": \"text\", \"text\": \"...\"}", "text"))
        self.received += len(text)
        if self.received > self.config.ws_max_session_chars:
            raise _End(error_frame(f"text: this session sent {self.received} characters, over the limit of "
                                   f"{self.config.ws_max_session_chars}; open a new session", "text",
                                   "input_too_long"))
        try:
            result: list[str] = sentences.feed(text)
        except ValueError as exc:
            raise _End(error_frame(str(exc), "text", "input_too_long")) from None
        return result

    async def _frame(self, idle_ok: bool, speaking: asyncio.Task[None] | None = None) -> dict[str, Any]:
        """The next JSON frame ({} when the speaking task ended first, or idle while it has work)."""
        receive = asyncio.ensure_future(self.websocket.receive())
        waits: set[asyncio.Future[Any]] = {receive} if speaking is None else {receive, speaking}
        done, _ = await asyncio.wait(waits, timeout=self.config.ws_idle_timeout_s,
                                     return_when=asyncio.FIRST_COMPLETED)
        if receive not in done:
            receive.cancel()
            with suppress(BaseException):
                await receive
            if speaking is not None and speaking in done:
                speaking.result()  # re-raises what ended it
                return {}
            if idle_ok:
                return {}
            raise _End(error_frame(f"session: sent nothing for {self.config.ws_idle_timeout_s:g} s with nothing to "
                                   "speak; closed", code="idle_timeout"), 1000)
        message = receive.result()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        return _parse(message)

    async def _open(self, body: SpeechBody, fmt: str, text: str) -> AudioStream:
        sentence = body.model_copy(update={"input": text})
        try:
            plan, params, _ = await self.state.service.text.run(self.state.speech, sentence)
            stream: AudioStream = await self.state.service.open(
                plan.text, params, refine=plan.refine, split=self.config.split_text,
                max_pieces=self.config.max_pieces, first_chunk_samples=FORMATS[fmt].first_chunk_samples,
                window=self.config.stream_window_pieces)
        except ValueError as exc:
            raise SessionError(_detail(exc)) from None
        return stream

    async def _send_json(self, payload: dict[str, Any]) -> None:
        await self._send(self.websocket.send_text(json.dumps(payload, ensure_ascii=False)))

    async def _send_bytes(self, data: bytes) -> None:
        await self._send(self.websocket.send_bytes(data))

    async def _send(self, sending: Any) -> None:
        try:
            await asyncio.wait_for(sending, self.config.send_timeout_s)
        except asyncio.TimeoutError:
            logger.info("closed a speech session whose client read nothing for %g s", self.config.send_timeout_s)
            raise _End(None, POLICY) from None


def _parse(message: Mapping[str, Any]) -> dict[str, Any]:
    if message.get("text") is None:
        raise _End(error_frame("frame: binary frames are not read here; send JSON text frames", "type"))
    try:
        frame = json.loads(message["text"])
    except ValueError as exc:
        raise _End(error_frame(f"frame: is not valid JSON ({str(exc)[:120]})", code="invalid_json")) from None
    if not isinstance(frame, dict):
        raise _End(error_frame("frame: must be a JSON object with a \"type\"", "type"))
    return frame


def _detail(exc: BaseException) -> dict[str, str | None]:
    """A failure as OpenAI's error detail (what the HTTP route would answer)."""
    if isinstance(exc, SessionError):
        return exc.detail
    if isinstance(exc, HTTPException) and isinstance(exc.detail, dict):
        return exc.detail
    if isinstance(exc, ValueError):
        detail = bad_request(exc).detail
        return detail if isinstance(detail, dict) else error_detail(str(exc))
    return error_detail(f"the server failed on this sentence: {exc}", kind="server_error", code="engine_unavailable")
