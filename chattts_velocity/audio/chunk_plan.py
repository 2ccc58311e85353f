"""Audio stage, streaming: which steps each decode window of a stream covers, and what the windows cost.

A stream emits its steps in chunks. Window k of a stream emits `chunk` new steps and decodes them with up to
`left` steps of left context and `lookahead` steps after them, so it decodes left + chunk + lookahead steps to emit
chunk: the Decoder's redundant work is (left + lookahead) / chunk. A `ChunkSchedule` starts with a small first
chunk (early first audio) and then doubles the chunk every window up to `max_chunk_steps`, so a long stream's
redundancy tends to (left + max + lookahead) / max. Every window that does not end its clip has a shape fixed by
the schedule alone: (min(left, emitted so far), chunk, lookahead) for the k-th window, the same for every stream,
which is what lets a GPU capture one graph per shape (audio/window_runner.py).
"""
from __future__ import annotations

from dataclasses import dataclass

STEP_FRAMES = 2  # mel frames per GPT step (the interleave)


@dataclass(frozen=True)
class ChunkSchedule:
    """Chunk sizes and lookaheads of a stream's windows, by window index."""

    chunk_steps: int
    lookahead_steps: int
    first_chunk_steps: int | None = None  # window 0's chunk (None: chunk_steps)
    first_lookahead_steps: int | None = None  # window 0's lookahead (None: lookahead_steps)
    max_chunk_steps: int | None = None  # the chunk doubles each window after the first up to this (None: fixed)

    def __post_init__(self) -> None:
        for name in ("chunk_steps", "lookahead_steps", "first_chunk_steps", "first_lookahead_steps",
                     "max_chunk_steps"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")

    def window(self, k: int) -> tuple[int, int]:
        """(chunk, lookahead) of a stream's k-th window (k = 0 is its first)."""
        if k == 0 and (self.first_chunk_steps or self.first_lookahead_steps):
            return self.first_chunk_steps or self.chunk_steps, self.first_lookahead_steps or self.lookahead_steps
        grown = k - 1 if self.first_chunk_steps or self.first_lookahead_steps else k
        cap = max(self.max_chunk_steps or self.chunk_steps, self.chunk_steps)
        return min(self.chunk_steps << min(grown, cap.bit_length()), cap), self.lookahead_steps


@dataclass(frozen=True)
class Span:
    """Steps [first, end) decoded to emit steps [next, stop): blocks [2 next, end_block) of hop samples."""

    first: int
    next: int
    stop: int
    end: int
    at_end: bool  # the window ends the clip: its right edge is real (end == the clip's last step + 1)

    @property
    def end_block(self) -> int:
        return STEP_FRAMES * self.end - 1 if self.at_end else STEP_FRAMES * self.stop


def plan_span(schedule: ChunkSchedule, k: int, next_step: int, total: int, left: int, at_end: bool) -> Span | None:
    """Window k of a stream whose steps [0, next_step) are emitted and [0, total) known; None if not due yet."""
    first = max(next_step - left, 0)
    if at_end:
        return Span(first, next_step, total, total, True) if total > next_step else None
    chunk, lookahead = schedule.window(k)
    stop = next_step + chunk
    return Span(first, next_step, stop, stop + lookahead, False) if stop + lookahead <= total else None


def mel_span(span: Span, mel_reach: int) -> tuple[int, int]:
    """Mel frames [m0, m1) Vocos needs for span's blocks (mel_reach = istft_half - 1 + Vocos radius each side,
    istft_half added on the right), clipped to the frames the window decodes."""
    m0 = STEP_FRAMES * span.next - mel_reach
    m1 = span.end_block + mel_reach + 1
    return max(m0, STEP_FRAMES * span.first), min(m1, STEP_FRAMES * span.end)


def stream_spans(schedule: ChunkSchedule, left: int, total_steps: int) -> list[Span]:
    """Every window of a clip of total_steps pushed one step at a time, then flushed."""
    spans: list[Span] = []
    next_step = 0
    for total in range(1, total_steps + 1):
        while (span := plan_span(schedule, len(spans), next_step, total, left, at_end=False)) is not None:
            spans.append(span)
            next_step = span.stop
    last = plan_span(schedule, len(spans), next_step, total_steps, left, at_end=True)
    return spans + ([last] if last is not None else [])


def redundancy(schedule: ChunkSchedule, left: int, mel_reach: int, total_steps: int) -> tuple[float, float]:
    """(Decoder, Vocos) work of streaming a clip of total_steps over that of one whole-clip pass."""
    spans = stream_spans(schedule, left, total_steps)
    decoder = sum(s.end - s.first for s in spans) / total_steps
    vocos = sum(m1 - m0 for m0, m1 in (mel_span(s, mel_reach) for s in spans)) / (STEP_FRAMES * total_steps)
    return decoder, vocos
