"""Serving stage: one speech WebSocket session's sentences, from the text that completed them to the audio sent.

Sentences are spoken in the order they completed. Each is opened on the SpeechService as soon as it completes (its
pieces queued on the shared engine at once), up to `window` sentences ahead of the one being sent; later ones wait
until the reader catches up, so a client that stops reading holds at most `window` sentences in the engine. A flush
marker in the same order ends one audio file: the encoder's tail, then {"type": "done"}.
"""
from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..audio.encode import Encoder, open_encoder
from ..audio.wav import SAMPLE_RATE
from ..speech.synthesis import AudioStream
from .request import error_detail

SendJson = Callable[[dict[str, Any]], Awaitable[None]]
SendBytes = Callable[[bytes], Awaitable[None]]
OpenSentence = Callable[[str], Coroutine[Any, Any, AudioStream]]


class SessionError(Exception):
    """A failure the session reports in band as OpenAI's error detail, then goes on (a sentence that cannot be
    spoken) or ends (the caller decides)."""

    def __init__(self, detail: dict[str, str | None]) -> None:
        super().__init__(detail["message"])
        self.detail = detail


@dataclass
class Sentence:
    index: int
    text: str
    opening: asyncio.Task[AudioStream] | None = None


@dataclass
class Flush:
    close: bool = False  # also close the session once spoken
    done: asyncio.Event = field(default_factory=asyncio.Event)


class SentenceQueue:
    """The session's sentences and flushes in order; `run()` speaks them (the one task that sends)."""

    def __init__(self, open_sentence: OpenSentence, fmt: str, send_json: SendJson, send_bytes: SendBytes,
                 window: int, to_detail: Callable[[BaseException], dict[str, str | None]]) -> None:
        self.open_sentence, self.fmt, self.window = open_sentence, fmt, window
        self.send_json, self.send_bytes, self.to_detail = send_json, send_bytes, to_detail
        self.items: deque[Sentence | Flush] = deque()
        self.sentences = 0  # sentences added so far (the next one's index)
        self.samples = 0  # audio samples sent so far: the session's clock
        self._more = asyncio.Event()
        self._encoder: Encoder = open_encoder(fmt)
        self._current: AudioStream | None = None

    @property
    def busy(self) -> bool:
        """Whether anything waits to be spoken or sent."""
        return bool(self.items)

    def add(self, text: str) -> None:
        self.items.append(Sentence(self.sentences, text))
        self.sentences += 1
        self._start_window()
        self._more.set()

    def flush(self, close: bool = False) -> Flush:
        marker = Flush(close)
        self.items.append(marker)
        self._more.set()
        return marker

    async def run(self) -> None:
        """Speak every item as it comes; returns after a closing flush has been spoken."""
        while True:
            while not self.items:
                self._more.clear()
                await self._more.wait()
            item = self.items[0]
            if isinstance(item, Flush):
                await self._end_file()
                self.items.popleft()
                item.done.set()
                if item.close:
                    return
                continue
            await self._speak(item)
            self.items.popleft()
            self._start_window()

    def close(self) -> None:
        """Abort every sentence opened or opening (their engine requests end, their KV blocks are freed)."""
        if self._current is not None:
            self._current.close()
        for item in self.items:
            if isinstance(item, Sentence) and item.opening is not None:
                item.opening.add_done_callback(_close_stream)
                item.opening.cancel()

    def _start_window(self) -> None:
        waiting = [item for item in self.items if isinstance(item, Sentence)][: self.window]
        for sentence in waiting:
            if sentence.opening is None:
                sentence.opening = asyncio.create_task(self.open_sentence(sentence.text))

    async def _speak(self, sentence: Sentence) -> None:
        assert sentence.opening is not None  # the first sentence waiting is always inside the window
        try:
            stream = await sentence.opening
        except (ValueError, RuntimeError, SessionError) as exc:
            await self.send_json({"type": "error", "index": sentence.index, "error": self.to_detail(exc)})
            return
        self._current = stream
        try:
            await self.send_json({"type": "sentence.start", "index": sentence.index, "text": sentence.text,
                                  "start": round(self.samples / SAMPLE_RATE, 4)})
            async for chunk in stream:
                await self._send_audio(chunk)
        except (ValueError, RuntimeError) as exc:  # the engine failed this sentence: say so, go on with the next
            await self.send_json({"type": "error", "index": sentence.index, "error": self.to_detail(exc)})
        finally:
            stream.close()
            self._current = None
        await self.send_json({"type": "sentence.end", "index": sentence.index, "text": sentence.text,
                              "end": round(self.samples / SAMPLE_RATE, 4)})

    async def _send_audio(self, chunk: np.ndarray) -> None:
        data = await asyncio.to_thread(self._encoder.encode, chunk)
        self.samples += len(chunk)
        if data:
            await self.send_bytes(data)

    async def _end_file(self) -> None:
        tail = await asyncio.to_thread(self._encoder.flush)
        if tail:
            await self.send_bytes(tail)
        self._encoder = open_encoder(self.fmt)  # audio after this flush is a new file in the format
        await self.send_json({"type": "done", "sentences": self.sentences, "audio_seconds":
                              round(self.samples / SAMPLE_RATE, 4)})


def _close_stream(task: asyncio.Task[AudioStream]) -> None:
    if not task.cancelled() and task.exception() is None:
        task.result().close()


def error_frame(message: str, param: str | None = None, code: str | None = None,
                kind: str = "invalid_request_error") -> str:
    return json.dumps({"type": "error", "error": error_detail(message, param, code, kind)}, ensure_ascii=False)
