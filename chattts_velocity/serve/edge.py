"""Serving stage, the edge: ASGI middleware that refuses a request before the app reads a byte of its body.

The framing and header size are checked first (Transfer-Encoding with Content-Length, or a header section over
MAX_HEADER_BYTES, is a 400 and the connection closes), then the API key (on /v1/*), then the body size
(Content-Length, or the bytes of a chunked body, read up to the limit and no further), the bytes all connections'
bodies hold at once (BodyBudget: past it a new body is a 503 at once) and the time the body takes to arrive, then that
a JSON body (application/json or application/*+json) parses (nesting and integer size included: 10**5 levels or a
5001-digit integer are invalid_json, not a traceback). Other bodies (uploads) are spooled to a temporary file past
SPOOL_BYTES, not held in memory. A refusal is OpenAI's error shape: 400 invalid_request / headers_too_large /
invalid_json, 401 invalid_api_key, 413 request_too_large, 408 request_timeout, 503 server_busy (with Retry-After).
"""
from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
from collections.abc import Callable
from typing import IO

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..engine.async_engine import CLIENT, QUOTAS
from .clients import Clients, KeyLimits
from .request import error_detail

BODY_METHODS = {"POST", "PUT", "PATCH"}
MAX_JSON_DIGITS = 1000  # digits of one JSON integer (a field check refuses 10**400 by name; parsing 10**5000 fails)
MAX_HEADER_BYTES = 16 << 10  # a request's header section (names, values, ": " and CRLF each)
SPOOL_BYTES = 1 << 20  # a non-JSON body beyond this goes to a temporary file
REPLAY_CHUNK = 1 << 16  # bytes per message when a spooled body is handed on
logger = logging.getLogger("chattts_velocity")


class _BodyTimeout(Exception):
    pass


class _OverBudget(Exception):
    pass


class _ClientStalled(Exception):
    pass


class BodyBudget:
    """Bytes of request bodies held at once, across all connections (one event loop: no lock)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0

    def take(self, claim: list[int], size: int) -> None:
        """Add `size` bytes to `claim` (one request's [bytes held]); _OverBudget if the budget cannot hold them."""
        if self.used + size > self.limit:
            raise _OverBudget
        self.used += size
        claim[0] += size

    def give_back(self, claim: list[int]) -> None:
        self.used -= claim[0]
        claim[0] = 0


class Edge:
    """Wraps the app: auth and size checks on every HTTP request; `on_refuse` counts each refusal."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int,
                 on_refuse: Callable[[], None] = lambda: None, path_limits: dict[str, int] | None = None,
                 body_timeout: float = 30.0, body_budget: int = 128 << 20, send_timeout: float = 30.0,
                 clients: Clients | None = None) -> None:
        self.app, self.max_body_bytes, self.on_refuse = app, max_body_bytes, on_refuse
        # who each request is from, and which keys it may hold (serve/clients.py); by default `api_key` alone
        self.clients = clients or Clients({api_key: KeyLimits()} if api_key else {}, None)
        self.path_limits = dict(path_limits or {})  # path -> its own body limit (voice uploads)
        self.body_timeout = body_timeout  # seconds the whole body may take to arrive
        self.budget = BodyBudget(body_budget)
        self.send_timeout = send_timeout  # seconds a response chunk may wait for a client that stopped reading

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        try:
            await self._http(scope, receive, self._bounded(send))
        except _ClientStalled:  # the app's stream was cancelled (its engine requests aborted); the connection closes
            logger.info("closed a response whose client read nothing for %g s", self.send_timeout)

    def _bounded(self, send: Send) -> Send:
        """send() as the app sees it: a client that stops reading pauses the app at its next chunk (the transport's
        flow control), and after send_timeout the response is abandoned."""
        async def bounded(message: Message) -> None:
            try:
                await asyncio.wait_for(send(message), self.send_timeout)
            except asyncio.TimeoutError:
                raise _ClientStalled from None
        return bounded

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("headers", [])
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw}
        if "transfer-encoding" in headers and "content-length" in headers:  # RFC 9112 6.3: smuggling; must close
            return await self._refuse(send, 400, "headers: Transfer-Encoding and Content-Length together frame the "
                                      "body two ways; send one", "invalid_request")
        if sum(len(k) + len(v) + 4 for k, v in raw) > MAX_HEADER_BYTES:
            return await self._refuse(send, 400, f"headers: larger than this server's limit of {MAX_HEADER_BYTES} "
                                      "bytes", "headers_too_large")
        client = self.clients.identify(scope, headers)
        CLIENT.set(client.name)  # this request's task (and the engine requests it makes) carry them
        QUOTAS.set(client.quotas)
        if not client.authorized and scope["path"].startswith("/v1/"):
            return await self._refuse(send, 401, "Incorrect API key provided; send 'Authorization: Bearer <key>'",
                                      "invalid_api_key")
        if scope["method"] not in BODY_METHODS:
            return await self.app(scope, receive, send)
        claim = [0]
        try:
            await self._checked_body(scope, headers, receive, send, claim)
        finally:
            self.budget.give_back(claim)

    async def _checked_body(self, scope: Scope, headers: dict[str, str], receive: Receive, send: Send,
                            claim: list[int]) -> None:
        limit = self.path_limits.get(scope["path"], self.max_body_bytes)
        is_json = is_json_type(headers.get("content-type", ""))
        spool = None if is_json else tempfile.SpooledTemporaryFile(SPOOL_BYTES)
        try:
            body = await self._read_body(headers, receive, limit, claim, spool)
        except _BodyTimeout:
            return await self._refuse(send, 408, f"body: did not arrive within {self.body_timeout:g} s",
                                      "request_timeout")
        except _OverBudget:
            return await self._refuse(send, 503, "server: busy receiving other requests' bodies; retry shortly",
                                      "server_busy", kind="server_error", retry_after=1)
        if body is None:
            return await self._refuse(send, 413, f"body: larger than this server's limit of {limit} bytes",
                                      "request_too_large")
        if spool is not None:
            with spool:
                spool.seek(0)
                return await self.app(scope, _replay_file(spool, receive), send)
        # a large body is parsed off the event loop (a JSON voice body may be 16 MiB)
        problem = json_problem(body) if len(body) < 1 << 16 else await asyncio.to_thread(json_problem, body)
        if problem is not None:
            return await self._refuse(send, 400, f"body: is not valid JSON ({problem})", "invalid_json")
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, headers: dict[str, str], receive: Receive, limit: int, claim: list[int],
                         spool: IO[bytes] | None) -> bytes | None:
        """The whole body (b"" when it went to `spool`), or None as soon as it is known to be over the limit. The
        budget holds the declared length at once, or a chunked body's bytes as they come."""
        declared = headers.get("content-length", "")
        if declared.isascii() and declared.isdigit():
            if len(declared) > 18 or int(declared) > limit:
                return None
            self.budget.take(claim, int(declared))
        chunks: list[bytes] = []
        size, more = 0, True
        deadline = time.monotonic() + self.body_timeout
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise _BodyTimeout from None
            if message["type"] != "http.request":
                break  # the client left; the app will see an empty body and the disconnect
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return None
            if size > claim[0]:
                self.budget.take(claim, size - claim[0])
            if spool is None:
                chunks.append(chunk)
            else:
                spool.write(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    async def _refuse(self, send: Send, status: int, message: str, code: str, kind: str = "invalid_request_error",
                      retry_after: int | None = None) -> None:
        self.on_refuse()
        body = json.dumps({"error": error_detail(message, code=code, kind=kind)}).encode()
        extra = [] if retry_after is None else [(b"retry-after", str(retry_after).encode())]
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close"), *extra]})
        await send({"type": "http.response.body", "body": body})


def is_json_type(content_type: str) -> bool:
    """application/json, application/*+json, or no type (the speech route reads JSON): FastAPI's own rule."""
    kind = content_type.split(";")[0].strip().lower()
    return kind in ("application/json", "") or (kind.startswith("application/") and kind.endswith("+json"))


def json_problem(body: bytes) -> str | None:
    """Why `body` is not JSON this server reads (None if it is, or is empty): syntax, nesting deeper than Python's
    recursion limit (the C parser's RecursionError), an integer of more than MAX_JSON_DIGITS digits."""
    if not body.strip():
        return None
    try:
        json.loads(body, parse_int=_bounded_int)
    except _LongInteger as exc:
        return str(exc)
    except RecursionError:
        return "nested too deeply"
    except ValueError as exc:
        return str(exc)[:200]
    return None


class _LongInteger(ValueError):
    pass


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_JSON_DIGITS:
        raise _LongInteger(f"an integer of {len(digits.lstrip('-'))} digits; at most {MAX_JSON_DIGITS}")
    return int(digits)


def _replay_file(spool: IO[bytes], receive: Receive) -> Receive:
    """A spooled body in REPLAY_CHUNK messages, then the client's own messages."""
    done = False

    async def replay() -> Message:
        nonlocal done
        if done:
            return await receive()
        chunk = spool.read(REPLAY_CHUNK)
        done = len(chunk) < REPLAY_CHUNK
        return {"type": "http.request", "body": chunk, "more_body": not done}
    return replay


def _replay(body: bytes, receive: Receive) -> Receive:
    """The buffered body as one message, then the client's own messages (a disconnect, say)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replay
