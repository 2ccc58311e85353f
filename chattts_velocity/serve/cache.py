"""Serving stage: a bounded cache of finished encoded audio for identical seeded requests.

A seeded request is a pure function of what it asks (text after SSML and instructions, voice, seed, every sampling
field, speed, format, loudness): the same bytes every time, so the second one need not run the model. Unseeded
requests draw fresh noise and are never cached. Least recently used entries leave first when the byte budget is
exceeded.
"""
from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable

from ..params import InferCodeParams, RefineTextParams
from .instructions import SpeechInput


class AudioCache:
    def __init__(self, budget_bytes: int) -> None:
        self.budget, self.used = budget_bytes, 0
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(plan: SpeechInput, params: InferCodeParams, fmt: str, loudness: float | None,
            streamed: bool) -> str | None:
        """The request's identity, or None when it cannot repeat (no seed). Streamed and whole-file bytes differ
        (a streamed container cannot know its length), so each is kept for its own kind of request."""
        if params.manual_seed is None or params.logits_processors:  # user code may do anything
            return None
        # every field of every params object, in order: any value that changes the audio changes the key
        material = (plan.text, plan.prompt, _values(plan.refine), _values(params), fmt, loudness, streamed)
        return hashlib.sha256(repr(material).encode()).hexdigest()

    def get(self, key: str | None) -> bytes | None:
        if key is None or self.budget <= 0:
            return None
        with self._lock:
            data = self._items.get(key)
            if data is not None:
                self._items.move_to_end(key)
            return data

    def put(self, key: str | None, data: bytes) -> None:
        if key is None or not data or len(data) > self.budget:
            return
        with self._lock:
            self.used += len(data) - len(self._items.pop(key, b""))
            self._items[key] = data
            while self.used > self.budget:
                self.used -= len(self._items.popitem(last=False)[1])

    def __len__(self) -> int:
        return len(self._items)


def _values(params: RefineTextParams | None) -> tuple[tuple[str, object], ...] | None:
    return None if params is None else tuple((f.name, getattr(params, f.name)) for f in dataclasses.fields(params))


async def recorded(chunks: AsyncIterator[bytes], store: Callable[[bytes], None]) -> AsyncIterator[bytes]:
    """chunks passed through; store(all of them) once the last was sent (never for a response cut short)."""
    parts: list[bytes] = []
    async for data in chunks:
        parts.append(data)
        yield data
    store(b"".join(parts))
