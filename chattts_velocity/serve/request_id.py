"""Serving stage: `x-request-id` on every response, the client's own when it sent a usable one, else a new id.

Outermost middleware, so refusals of the edge (401, 413, ...) carry it too; routes read it as
`request.state.request_id` (for their log lines).
"""
from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = b"x-request-id"
_USABLE = re.compile(r"[\x21-\x7e]{1,200}")  # visible ASCII: echoed as is, never a header injection


class RequestId:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((value.decode("latin-1") for name, value in scope["headers"]
                      if name.lower() == REQUEST_ID_HEADER), "")
        request_id = given if _USABLE.fullmatch(given) else f"req_{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID_HEADER]
                message = {**message, "headers": [*headers, (REQUEST_ID_HEADER, request_id.encode())]}
            await send(message)

        await self.app(scope, receive, send_with_id)
