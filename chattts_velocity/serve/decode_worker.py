"""Serving stage: the decode thread — the audio windows of every live stream, decoded together.

In: rows of codes (or hidden states) pushed per stream key by the request tasks. Out: float32 24 kHz chunks handed
to each stream's sink (a chunk queue on the consumer's event loop), then END.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from ..speech.mel_source import MelSource
from ..speech.streams import StreamSet

logger = logging.getLogger("chattts_velocity.serve")
END = None  # a stream's last item on a chunk queue
Item = np.ndarray | BaseException | None  # what a chunk queue holds: float32 chunks, then END (or an exception)
Sink = Callable[[Item], None]


@dataclass
class _Open:
    key: str
    mel: MelSource
    sink: Sink
    first_chunk_samples: int


@dataclass
class _Push:
    key: str
    rows: torch.Tensor | None  # [n, C]
    finished: bool


@dataclass
class _Drop:
    key: str


class DecodeWorker:
    """A thread that owns a StreamSet: rows pushed by many requests are decoded together, chunks go to sinks.

    NOTE: only this thread touches the StreamDecoders. While it decodes one batch the next round's rows
    pile up in the inbox, so the busier the server, the more windows share one Decoder + Vocos call.
    """

    def __init__(self, streams: StreamSet[str]) -> None:
        self.streams = streams
        self.max_batch = 0  # most streams that got audio from one batched decode
        self._inbox: queue.SimpleQueue[_Open | _Push | _Drop | None] = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._thread = threading.Thread(target=self._loop, name="chattts-decode", daemon=True)
        self._thread.start()

    def open(self, key: str, mel: MelSource, sink: Sink, first_chunk_samples: int = 0) -> None:
        self._inbox.put(_Open(key, mel, sink, first_chunk_samples))

    def push(self, key: str, rows: torch.Tensor | None, finished: bool) -> None:
        self._inbox.put(_Push(key, rows, finished))

    def drop(self, key: str) -> None:
        self._inbox.put(_Drop(key))

    def shutdown(self, timeout: float = 30.0) -> None:
        self._inbox.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            messages = [self._inbox.get()]
            while not self._inbox.empty():
                messages.append(self._inbox.get())
            if None in messages:
                return
            try:
                rows, ended = self._apply(messages)
                if rows or ended:
                    self._decode(rows, ended)
            except Exception:  # noqa: BLE001 -- a bug here must not silence every other stream
                logger.exception("decode worker: round failed")

    def _apply(self, messages: list[_Open | _Push | _Drop | None]) -> tuple[dict[str, torch.Tensor], list[str]]:
        rows: dict[str, list[torch.Tensor]] = {}
        ended: list[str] = []
        for m in messages:
            if isinstance(m, _Open):
                try:
                    self.streams.open(m.key, m.mel, m.first_chunk_samples)
                    self._sinks[m.key] = m.sink
                except ValueError as exc:
                    m.sink(exc)
            elif isinstance(m, _Drop):
                self.streams.drop(m.key)
                self._sinks.pop(m.key, None)
                rows.pop(m.key, None)
                ended = [k for k in ended if k != m.key]
            elif isinstance(m, _Push) and m.key in self._sinks:
                if m.rows is not None and len(m.rows):
                    rows.setdefault(m.key, []).append(m.rows)
                if m.finished:
                    ended.append(m.key)
        return {k: torch.cat(v) for k, v in rows.items()}, ended

    def _decode(self, rows: dict[str, torch.Tensor], ended: list[str]) -> None:
        # Streams still waiting for their first audio go first, in their own (small) batch, so a request
        # that just joined does not wait behind the steady windows of everyone else.
        fresh = {k: r for k, r in rows.items() if self.streams.streams[k].emitted_samples == 0}
        steady = {k: r for k, r in rows.items() if k not in fresh}
        for group in (fresh, steady):
            if group:
                self._run(list(group), partial(self.streams.push, group))
        ended = [k for k in ended if k in self._sinks]  # not failed above
        if ended:
            self._run(ended, lambda: self.streams.finish(ended))
        for key in ended:
            if key in self._sinks:
                self._sinks.pop(key)(END)

    def _run(self, keys: list[str], decode: Callable[[], dict[str, np.ndarray]]) -> None:
        """One batched decode; chunks (or the error) go to the keys' sinks."""
        try:
            with torch.inference_mode():
                chunks = decode()
        except Exception as exc:  # noqa: BLE001 -- the requests involved get the error, the worker lives on
            for key in keys:
                self.streams.drop(key)
                sink = self._sinks.pop(key, None)
                if sink is not None:
                    sink(exc)
            return
        self.max_batch = max(self.max_batch, sum(len(c) > 0 for c in chunks.values()))
        for key, chunk in chunks.items():
            if len(chunk):
                self._sinks[key](chunk)


def sink_to(loop: asyncio.AbstractEventLoop, chunks: asyncio.Queue[Item]) -> Sink:
    """Hand items from the decode thread to a queue on the consumer's loop."""
    def put(item: Item) -> None:
        try:
            loop.call_soon_threadsafe(chunks.put_nowait, item)
        except RuntimeError:  # the consumer's loop is closed: nobody is listening any more
            pass
    return put
