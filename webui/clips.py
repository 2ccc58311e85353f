"""Web UI audio helpers: uploaded clip -> 24 kHz mono float32 (numpy resampling), run stats.

Kept free of gradio so they can be tested and reused without a browser.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chattts_velocity.audio import SAMPLE_RATE
from chattts_velocity.audio.wav import NO_LENGTH_HINT, UNKNOWN_FRAMES

_ZERO_CROSSINGS = 16  # half-width of the windowed-sinc kernel, in input samples at the cutoff
_BLOCK = 8192  # output samples per block, bounds the [block, taps] matrix


def to_mono(data: np.ndarray) -> np.ndarray:
    """[N] or [N, channels] samples (float or integer PCM) -> float32 [N] in [-1, 1]."""
    x = np.asarray(data)
    if x.ndim not in (1, 2):
        raise ValueError(f"clip: expected [samples] or [samples, channels] audio, got shape {x.shape}")
    if np.issubdtype(x.dtype, np.integer):
        x = x.astype(np.float64) / float(-np.iinfo(x.dtype).min)
    x = x.astype(np.float64)
    return (x.mean(axis=1) if x.ndim == 2 else x).astype(np.float32)


def resample(x: np.ndarray, rate_in: int, rate_out: int = SAMPLE_RATE) -> np.ndarray:
    """Band-limited resampling of mono float audio with a Hann-windowed sinc kernel.

    Output sample n sits at input time n * rate_in / rate_out; the cutoff is the lower Nyquist
    frequency, so downsampling does not alias.
    """
    if rate_in <= 0 or rate_out <= 0:
        raise ValueError(f"sample rate: must be > 0, got {rate_in} -> {rate_out}")
    x = np.asarray(x, dtype=np.float64)
    if rate_in == rate_out or x.size == 0:
        return x.astype(np.float32)
    cutoff = min(1.0, rate_out / rate_in)  # in units of the input Nyquist-normalised rate
    half = int(math.ceil(_ZERO_CROSSINGS / cutoff))
    n_out = int(math.floor(x.size * rate_out / rate_in))
    offsets = np.arange(-half + 1, half + 1)  # [taps]
    padded = np.pad(x, (half, half + 1))
    out = np.empty(n_out, dtype=np.float64)
    for start in range(0, n_out, _BLOCK):
        t = np.arange(start, min(start + _BLOCK, n_out)) * (rate_in / rate_out)  # [b] input time
        base = np.floor(t).astype(np.int64)
        idx = base[:, None] + offsets[None, :]  # [b, taps]
        dist = t[:, None] - idx  # [b, taps]
        window = 0.5 + 0.5 * np.cos(np.pi * np.clip(dist / half, -1.0, 1.0))
        kernel = cutoff * np.sinc(cutoff * dist) * window
        out[start : start + len(t)] = (padded[idx + half] * kernel).sum(axis=1)
    return out.astype(np.float32)


def read_clip(path: str | Path) -> np.ndarray:
    """An audio file (any rate, any channel count) -> float32 24 kHz mono [N]."""
    import soundfile as sf

    try:
        with sf.SoundFile(str(path)) as f:
            if f.frames == UNKNOWN_FRAMES:
                raise ValueError(f"clip: {Path(path).name}: {NO_LENGTH_HINT}")
            data, rate = f.read(dtype="float32", always_2d=True), f.samplerate  # [N, channels]
    except (RuntimeError, sf.LibsndfileError):
        raise ValueError(f"clip: {Path(path).name} is not audio this page can read; "  # libsndfile's text names
                         "upload a WAV, FLAC, OGG or MP3 file") from None  # the server's temp path, not the cause
    if data.shape[0] == 0:
        raise ValueError("clip: the uploaded file has no samples")
    return resample(to_mono(data), rate, SAMPLE_RATE)


@dataclass
class RunStats:
    """Timing of one Generate click; times are perf_counter seconds. `end` is set when synthesis ends."""

    start: float
    samples: int = 0
    first_audio: float | None = None
    end: float | None = None

    def add(self, num_samples: int, now: float) -> None:
        if num_samples > 0 and self.first_audio is None:
            self.first_audio = now
        self.samples += num_samples

    def summary(self, now: float | None = None, head: str | None = None) -> str:
        """Stats text up to `now` (default: `end`, else the current time); `head` is a first line (a running
        stream, an interrupted run)."""
        now = now if now is not None else self.end if self.end is not None else time.perf_counter()
        audio_s = self.samples / SAMPLE_RATE
        wall = now - self.start
        ttfa = "n/a" if self.first_audio is None else f"{self.first_audio - self.start:.2f} s"
        rtf = f"{wall / audio_s:.3f}" if audio_s > 0 else "n/a"
        lines = [f"audio: {audio_s:.2f} s", f"wall: {wall:.2f} s", f"time to first audio: {ttfa}",
                 f"real-time factor: {rtf} (wall / audio; < 1 is faster than real time)"]
        return "\n".join(([head] if head else []) + lines)

    def progress(self, doing: str, now: float | None = None) -> str:
        """The one progress line a run shows while it works: what it does, the time so far, the audio made."""
        wall = (now if now is not None else time.perf_counter()) - self.start
        audio = f", {self.samples / SAMPLE_RATE:.1f} s of audio so far" if self.samples else ""
        return f"{doing}... {wall:.1f} s{audio}"
