"""Audio stage: sentence timestamps — where each sentence piece starts and ends in a text's audio.

A text's audio is its pieces' audio back to back (a script's pauses are the only gaps: Timeline.pause), so a piece's
span follows from the sample counts before it. The server's SSE events, the export's JSON sidecar and the captions
(audio/captions.py) all count here.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .wav import SAMPLE_RATE


@dataclass(frozen=True)
class Timestamp:
    text: str  # the piece as the model read it (normalised, refined if the refine pass ran)
    start: float  # seconds from the start of the text's audio
    end: float

    def as_dict(self) -> dict[str, object]:
        return {key: round(value, 4) if isinstance(value, float) else value for key, value in asdict(self).items()}


@dataclass
class Spoken:
    """A text's waveform with its sentence pieces' spans (Chat.infer_many(..., timestamps=True))."""

    wav: np.ndarray  # float32 [samples], 24 kHz
    timestamps: list[Timestamp]


class Timeline:
    """Pieces appended in playing order -> their Timestamps."""

    def __init__(self, sample_rate: int = SAMPLE_RATE) -> None:
        self.sample_rate, self.samples = sample_rate, 0
        self.stamps: list[Timestamp] = []

    def add(self, text: str, samples: int) -> Timestamp:
        start, self.samples = self.samples, self.samples + samples
        stamp = Timestamp(text, start / self.sample_rate, self.samples / self.sample_rate)
        self.stamps.append(stamp)
        return stamp

    def pause(self, samples: int) -> None:
        """`samples` of silence between pieces: no stamp, the next piece starts later."""
        self.samples += samples


def sample_span(stamp: Timestamp, sample_rate: int = SAMPLE_RATE) -> tuple[int, int]:
    """A stamp's [start, end) in samples: the integers its seconds were made from (exact: a float holds
    n / 24000 closer than half a sample for any n below 2**40)."""
    return round(stamp.start * sample_rate), round(stamp.end * sample_rate)


def piece_timestamps(texts: list[str], sample_counts: list[int], sample_rate: int = SAMPLE_RATE) -> list[Timestamp]:
    """Every piece's span, for pieces whose lengths are all known."""
    timeline = Timeline(sample_rate)
    return [timeline.add(text, count) for text, count in zip(texts, sample_counts, strict=True)]
