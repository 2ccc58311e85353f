"""Serving stage, the edge: ASGI middleware that refuses a request before the app reads a byte of its body.

The API key (on /v1/*) is checked first, then the body size (Content-Length, or the bytes of a chunked body, read
up to the limit and no further) and the time the body takes to arrive, then that a JSON body parses (nesting and
integer size included: 10**5 levels or a 5001-digit integer are invalid_json, not a traceback). A refusal is
OpenAI's error shape: 401 invalid_api_key, 413 request_too_large, 408 request_timeout, 400 invalid_json.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Awaitable, Callable

from .request import error_detail

Scope = dict
Message = dict
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
BODY_METHODS = {"POST", "PUT", "PATCH"}
MAX_JSON_DIGITS = 1000  # digits of one JSON integer (a field check refuses 10**400 by name; parsing 10**5000 fails)


class _BodyTimeout(Exception):
    pass


class Edge:
    """Wraps the app: auth and size checks on every HTTP request; `on_refuse` counts each refusal."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int,
                 on_refuse: Callable[[], None] = lambda: None, path_limits: dict[str, int] | None = None,
                 body_timeout: float = 30.0) -> None:
        self.app, self.api_key, self.max_body_bytes, self.on_refuse = app, api_key, max_body_bytes, on_refuse
        self.path_limits = dict(path_limits or {})  # path -> its own body limit (voice uploads)
        self.body_timeout = body_timeout  # seconds the whole body may take to arrive

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.api_key is not None and scope["path"].startswith("/v1/") and not self._authorized(headers):
            return await self._refuse(send, 401, "Incorrect API key provided; send 'Authorization: Bearer <key>'",
                                      "invalid_api_key")
        if scope["method"] not in BODY_METHODS:
            return await self.app(scope, receive, send)
        limit = self.path_limits.get(scope["path"], self.max_body_bytes)
        try:
            body = await self._read_body(headers, receive, limit)
        except _BodyTimeout:
            return await self._refuse(send, 408, f"body: did not arrive within {self.body_timeout:g} s",
                                      "request_timeout")
        if body is None:
            return await self._refuse(send, 413, f"body: larger than this server's limit of {limit} bytes",
                                      "request_too_large")
        problem = None
        if _is_json(headers):  # a large body is parsed off the event loop (a voice upload may be 16 MiB)
            problem = json_problem(body) if len(body) < 1 << 16 else await asyncio.to_thread(json_problem, body)
        if problem is not None:
            return await self._refuse(send, 400, f"body: is not valid JSON ({problem})", "invalid_json")
        await self.app(scope, _replay(body, receive), send)

    def _authorized(self, headers: dict[str, str]) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.api_key.encode())

    async def _read_body(self, headers: dict[str, str], receive: Receive, limit: int) -> bytes | None:
        """The whole body, or None as soon as it is known to be over the limit."""
        declared = headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
            return None
        chunks, size, more = [], 0, True
        deadline = time.monotonic() + self.body_timeout
        while more:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise _BodyTimeout from None
            if message["type"] != "http.request":
                break  # the client left; the app will see an empty body and the disconnect
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                return None
            more = message.get("more_body", False)
        return b"".join(chunks)

    async def _refuse(self, send: Send, status: int, message: str, code: str) -> None:
        self.on_refuse()
        body = json.dumps({"error": error_detail(message, code=code)}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def _is_json(headers: dict[str, str]) -> bool:
    return headers.get("content-type", "application/json").split(";")[0].strip().lower() in ("application/json", "")


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
