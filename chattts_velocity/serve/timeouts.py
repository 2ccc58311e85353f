"""Serving stage: how long a client may take to send a request (slow clients hold a connection, nothing more).

What bounds what, under `run_server` (uvicorn, h11):
- the headers: `HeaderTimeout` closes a connection whose request line and headers are not complete within
  `ServerConfig.header_timeout_s` of its first byte (of the connection, or of the next request on a kept-alive one);
  uvicorn itself has no such limit (a client that sends half a header was held until the OS gave up);
- the body: serve/edge.py reads it within `ServerConfig.body_timeout_s` or answers 408 `request_timeout`;
- idle kept-alive connections: uvicorn's `timeout_keep_alive` (5 s);
- a client that stops reading: once the transport's buffer is full, the connection is aborted (socket and queued
  bytes freed at once; a plain close would wait for the buffer to drain, forever) when it has not drained for
  `ServerConfig.send_timeout_s`, or at shutdown (SIGTERM) at once; serve/edge.py cancels the response itself at the
  same timeout, which aborts its pieces. Responses still being read get `ServerConfig.shutdown_grace_s` at shutdown;
- header size: h11's 16 KiB limit on an incomplete event (a 400 past it); body size: serve/edge.py (413).
Behind a proxy, its own limits apply first (nginx: client_header_timeout, client_body_timeout).
"""
from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def header_timeout_protocol(seconds: float, send_timeout: float = 30.0) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline on each request's headers and on a stalled reader's buffer."""
    return type("HeaderTimeout", (HeaderTimeout,), {"header_timeout": seconds, "send_timeout": send_timeout})


class HeaderTimeout(H11Protocol):
    header_timeout = 10.0
    send_timeout = 30.0
    _header_timer: asyncio.TimerHandle | None = None
    _stall_timer: asyncio.TimerHandle | None = None  # armed while the transport's write buffer is full

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
        self._resumed()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall_timer is None:
            self._stall_timer = self.loop.call_later(self.send_timeout, self._reader_stalled)

    def resume_writing(self) -> None:
        self._resumed()
        super().resume_writing()

    def shutdown(self) -> None:
        if self._stall_timer is not None:  # its client reads nothing: nothing to wait for
            self._reader_stalled()
        else:
            super().shutdown()

    def _resumed(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _reader_stalled(self) -> None:
        self._resumed()
        if not self.transport.is_closing() or self.transport.get_write_buffer_size():
            self.logger.info("aborting a connection whose client read nothing for %g s", self.send_timeout)
            self.transport.abort()

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
