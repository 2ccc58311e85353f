"""Streaming speech: engine deltas -> StreamDecoder -> float32 24 kHz chunks, in order per text.

Shared by the local runner's "chunks" stream (`stream_texts`, here: the caller's thread steps the engine) and the
server's engine runner (`serve/engine_runner.py`: an AsyncLLMEngine plus a decode thread running a StreamSet). With
the default StreamOptions a text's chunks concatenate to its whole-clip waveform within the StreamDecoder tolerance
(1e-5 max abs).
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

import numpy as np
import torch

from ..audio.chunk_plan import STEP_FRAMES, stream_spans
from ..audio.streaming import StreamDecoder
from ..engine.gpt import GPTBackend
from ..schema import SpeechRequests
from .mel_source import MelSource

EMPTY = np.zeros(0, dtype=np.float32)
K = TypeVar("K", bound=Hashable)  # a StreamSet's keys: pieces (int) in stream_texts, request ids (str) in the server


@dataclass(frozen=True)
class StreamOptions:
    """Chunking of the streamed audio. None = the StreamDecoder's exact receptive-field default.

    The default starts low-latency (first chunk 4 steps, lookahead 24: the stream tables of docs/performance.md);
    StreamOptions(first_chunk_steps=None, first_lookahead_steps=None) is the exact stream.

    first_chunk_steps / first_lookahead_steps apply to a stream's first window; later chunks are exact again (their
    left context is real). After it the chunk doubles every window, from chunk_steps up to max_chunk_steps
    (audio/chunk_plan.py), which keeps the redundant work of the exact context (52 steps each side, full size) at
    most 2x one whole-clip pass for clips of 10 s and longer (Decoder 1.9x at 10 s, 1.6x at 60 s; 5.2x with chunks
    of 24 throughout; tests/audio/test_chunk_plan.py). A first lookahead below the exact one (52 steps full size)
    makes the end of the first chunk approximate and its join to the second one may click. Measured on full-size
    random demo weights (first chunk 8 steps; error vs the whole-clip decode, whose peak was 0.23): lookahead 24 ->
    exact (6e-7), 16 -> max 1.9e-4, 8 -> max 2.4e-2 (5 % rms of the chunk), 4 -> max 9.7e-2 (30 % rms). Real weights
    may reach further; re-measure before lowering it in production.
    """

    chunk_steps: int = 24
    left_context_steps: int | None = None
    lookahead_steps: int | None = None
    first_chunk_steps: int | None = 4  # first audio after 4 + 24 steps instead of the exact 76
    first_lookahead_steps: int | None = 24  # measured 5.1e-7 from the whole-clip decode (exact default: 5.7e-7)
    max_chunk_steps: int | None = 192  # 4 s; None keeps chunk_steps throughout

    def __post_init__(self) -> None:
        for name in ("chunk_steps", "first_chunk_steps", "first_lookahead_steps", "lookahead_steps",
                     "max_chunk_steps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}: must be an integer >= 1 (or None for the exact default), got {value!r}")
        if self.left_context_steps is not None and self.left_context_steps < 0:
            raise ValueError(f"left_context_steps: must be >= 0, got {self.left_context_steps!r}")


class StreamSet(Generic[K]):
    """StreamDecoders by key, each on its mel source; each push/finish decodes every due window in one batch per
    source."""

    def __init__(self, options: StreamOptions | None = None) -> None:
        self.options = options or StreamOptions()
        self.streams: dict[K, StreamDecoder] = {}
        self.sources: dict[K, MelSource] = {}

    def open(self, key: K, mel: MelSource, first_chunk_samples: int = 0) -> None:
        """A stream for key; its first chunk holds at least first_chunk_samples (what the response's encoder needs
        before it gives out audio: audio/formats.py)."""
        o = self.options
        stream = mel.stream_decoder(o.chunk_steps, o.left_context_steps, o.lookahead_steps)
        step_samples = STEP_FRAMES * stream.vocos.head.istft.hop_length
        least = math.ceil(first_chunk_samples / step_samples)  # the encoder's first frame, in steps
        first = max(o.first_chunk_steps or stream.chunk_steps, least) if least or o.first_chunk_steps else None
        stream.schedule = replace(stream.schedule, first_chunk_steps=first,
                                  first_lookahead_steps=o.first_lookahead_steps, max_chunk_steps=o.max_chunk_steps)
        self.streams[key], self.sources[key] = stream, mel

    def push(self, rows: dict[K, torch.Tensor]) -> dict[K, np.ndarray]:
        """Append each key's new steps [n, C]; returns the samples that became final, per key."""
        return self._batched(list(rows), lambda group: StreamDecoder.push_many(
            [self.streams[k] for k in group], [rows[k] for k in group]))

    def finish(self, keys: list[K]) -> dict[K, np.ndarray]:
        """Flush and forget the keys' streams; returns their remaining samples."""
        out = self._batched(keys, lambda group: StreamDecoder.flush_many([self.streams[k] for k in group]))
        for key in keys:
            self.drop(key)
        return out

    def due_rows(self, max_rows: int) -> set[int]:
        """The row counts (of streams up to max_rows long) at which one of the open streams has a window due."""
        schedules = {(stream.schedule, stream.left_context_steps) for stream in self.streams.values()}
        return {span.end for schedule, left in schedules for span in stream_spans(schedule, left, max_rows)
                if not span.at_end}

    def drop(self, key: K) -> None:
        self.streams.pop(key, None)
        self.sources.pop(key, None)

    def _batched(self, keys: list[K], run: Callable[[list[K]], list[np.ndarray]]) -> dict[K, np.ndarray]:
        out: dict[K, np.ndarray] = {}
        by_source: dict[int, list[K]] = {}  # push_many needs streams on the same modules
        for key in keys:
            by_source.setdefault(id(self.sources[key]), []).append(key)
        for group in by_source.values():
            with self.sources[group[0]].autocast():
                out.update(zip(group, run(group), strict=True))
        return out


# ---- synchronous streaming for the local runner ----------------------------------------------------
class InOrder:
    """Per text, releases piece audio in piece order: a later piece is held until the earlier ones finish."""

    def __init__(self, owner: list[int], num_texts: int) -> None:
        self.order = [deque(k for k, i in enumerate(owner) if i == t) for t in range(num_texts)]
        self.held: dict[int, list[np.ndarray]] = {}
        self.done: set[int] = set()

    def add(self, piece: int, chunk: np.ndarray, finished: bool) -> None:
        self.held.setdefault(piece, []).append(chunk)
        if finished:
            self.done.add(piece)

    def take(self) -> list[np.ndarray]:
        """One chunk per text (maybe empty): everything now releasable."""
        out = []
        for pieces in self.order:
            parts = []
            while pieces:
                parts += self.held.pop(pieces[0], [])
                if pieces[0] not in self.done:
                    break
                pieces.popleft()
            out.append(np.concatenate(parts).astype(np.float32) if parts else EMPTY)
        return out


def stream_texts(streams: StreamSet[int], gpt: GPTBackend, requests: SpeechRequests, mel: MelSource,
                 should_stop: Callable[[], bool] = lambda: False) -> Iterator[list[np.ndarray]]:
    """A "chunks" job on the local runner: yields one new chunk per text whenever any text has new audio. The GPT
    hands rows on every chunk_steps steps and whenever a window of a stream becomes due (StreamSet.due_rows), so
    batching the hand-offs delays no audio."""
    for k in range(len(requests.prompts)):
        streams.open(k, mel)
    order = InOrder(requests.pieces.owner, requests.pieces.num_texts)
    due = streams.due_rows(max((sp.max_new_token for sp in requests.sampling), default=0))
    steps = gpt.stream(requests.prompts, requests.sampling, streams.options.chunk_steps, should_stop, due)
    for deltas in steps:
        for _, delta in deltas:
            if delta.error is not None:
                raise delta.error
        with torch.inference_mode():
            chunks = streams.push({k: mel.rows(d) for k, d in deltas if len(d.token_ids)})
            ended = [k for k, d in deltas if d.finished]
            for k, chunk in streams.finish(ended).items():
                chunks[k] = np.concatenate([chunks.get(k, EMPTY), chunk])
        for k, chunk in chunks.items():
            order.add(k, chunk, False)
        for k in ended:
            order.add(k, EMPTY, True)
        out = order.take()
        if any(len(c) for c in out):
            yield out
