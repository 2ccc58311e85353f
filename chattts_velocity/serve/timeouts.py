"""Serving stage: how long a client may take to send a request (slow clients hold a connection, nothing more).

What bounds what, under `run_server` (uvicorn, h11):
- the headers: `HeaderTimeout` closes a connection whose request line and headers are not complete within
  `ServerConfig.header_timeout_s` of its first byte (of the connection, or of the next request on a kept-alive one);
  uvicorn itself has no such limit (a client that sends half a header was held until the OS gave up);
- the body: serve/edge.py reads it within `ServerConfig.body_timeout_s` or answers 408 `request_timeout`;
- idle kept-alive connections: uvicorn's `timeout_keep_alive` (5 s);
- header size: h11's 16 KiB limit on an incomplete event (a 400 past it); body size: serve/edge.py (413).
Behind a proxy, its own limits apply first (nginx: client_header_timeout, client_body_timeout).
"""
from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def header_timeout_protocol(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline on each request's headers."""
    return type("HeaderTimeout", (HeaderTimeout,), {"header_timeout": seconds})


class HeaderTimeout(H11Protocol):
    header_timeout = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    # mypy silenced below: the base declares BaseTransport; uvicorn's h11 protocol is only given a Transport
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # a request's headers are (still) coming
            self._arm()
        else:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.info("closing a connection that sent no complete request headers in %g s", self.header_timeout)
            self.transport.close()
