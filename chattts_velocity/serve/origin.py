"""Serving stage: browser-safe writes (the CSRF check), before the edge reads a body.

A web page in a browser can make the user's browser send POSTs to this server (a form, or fetch() with a "simple"
content type, no preflight), with no way for the page to read the answer: enough to overwrite a voice. So a
state-changing request (POST, PUT, PATCH, DELETE) on /v1/* is refused with 403 when it carries an `Origin` that is
neither the server's own (its host and port equal to the Host header) nor on `allowed_origins`, or, without an
Origin, a `Sec-Fetch-Site: cross-site`. Clients that are not browsers send neither and pass. The voice route also
refuses a body without a Content-Type (browsers send JSON-looking text/plain that way), and takes a multipart upload
(which any form can send) only with a header no form can set: Authorization, X-Requested-With, or a same-origin
Origin. Errors are OpenAI's shape: 403 `cross_origin_refused` / `csrf_header_required`, 400
`unsupported_media_type`.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Collection
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from .request import error_detail

STATE_CHANGING = {"POST", "PUT", "PATCH", "DELETE"}


class BrowserGuard:
    """Wraps the app: cross-origin writes refused; `form_paths` take multipart only with a custom header."""

    def __init__(self, app: ASGIApp, allowed_origins: Collection[str], form_paths: Collection[str],
                 on_refuse: Callable[[], None] = lambda: None) -> None:
        self.app, self.form_paths, self.on_refuse = app, set(form_paths), on_refuse
        self.allowed = {o.strip().rstrip("/").lower() for o in allowed_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in STATE_CHANGING and scope["path"].startswith("/v1/"):
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            problem = self.problem(scope, headers)
            if problem is not None:
                self.on_refuse()
                return await _refuse(send, *problem)
        await self.app(scope, receive, send)

    def problem(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str, str] | None:
        """(status, message, code) of a refusal, or None."""
        origin = headers.get("origin")
        if origin is not None and not self.trusted(origin, headers.get("host", "")):
            return 403, (f"origin: {origin[:100]!r} may not send {scope['method']} requests to this server; its "
                         "operator can allow it with --allowed-origins"), "cross_origin_refused"
        if origin is None and headers.get("sec-fetch-site", "").lower() == "cross-site":
            return 403, "origin: a cross-site browser request may not change this server", "cross_origin_refused"
        if scope["method"] != "POST" or scope["path"] not in self.form_paths:
            return None
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        if not kind:
            return 400, "body: send Content-Type: application/json (or a multipart/form-data upload)", \
                "unsupported_media_type"
        if kind == "multipart/form-data" and origin is None and not (
                "authorization" in headers or "x-requested-with" in headers):
            return 403, ("headers: a multipart upload needs an X-Requested-With (or Authorization) header, which "
                         "a web page's form cannot send"), "csrf_header_required"
        return None

    def trusted(self, origin: str, host: str) -> bool:
        """`origin` is the server's own (its host:port is the Host header) or an allowed one."""
        if origin.strip().rstrip("/").lower() in self.allowed:
            return True
        try:
            parts = urlsplit(origin.strip())
        except ValueError:  # "http://[::1" and the like
            return False
        return parts.scheme in ("http", "https") and bool(parts.netloc) and parts.netloc.lower() == host.lower()


async def _refuse(send: Send, status: int, message: str, code: str) -> None:
    body = json.dumps({"error": error_detail(message, code=code)}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
