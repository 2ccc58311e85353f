"""Audio stage: captions. Sentence timestamps (audio/timestamps.py) -> SubRip (.srt) or WebVTT (.vtt) text.

One cue per sentence piece, spanning the samples that piece's audio fills in the final waveform (after speed, the
refine pass and a script's pauses: the timeline counts the real audio). Both formats write milliseconds, so a cue
edge is its sample boundary rounded to the nearest millisecond (24 samples at 24 kHz). A cue's text is the piece as
the model read it (normalised, refined if the refine pass ran) without ChatTTS's control tokens ([uv_break], ...).
Word-level cues are not made: the model gives no alignment of words to audio frames, so any word timing would be a
guess.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from .timestamps import Timestamp, sample_span
from .wav import SAMPLE_RATE

CAPTION_FORMATS = ("srt", "vtt")
_TOKEN = re.compile(r"\[\w+\]")


def check_captions(value: object, field: str = "captions") -> str | None:
    """None or one of CAPTION_FORMATS (case-insensitive) -> the format's name; a ValueError naming `field`."""
    if value is None:
        return None
    if not isinstance(value, str) or value.lower() not in CAPTION_FORMATS:
        raise ValueError(f"{field}: must be one of {list(CAPTION_FORMATS)}, got {value!r}")
    return value.lower()


def captions(stamps: Sequence[Timestamp], fmt: str, sample_rate: int = SAMPLE_RATE) -> str:
    """The whole caption file for `stamps` (in playing order) in `fmt` ("srt" or "vtt")."""
    fmt = check_captions(fmt, "fmt") or ""
    cues = [(sample_span(stamp, sample_rate), text) for stamp in stamps if (text := cue_text(stamp.text))]
    if fmt == "srt":
        blocks = [f"{n}\n{_clock(a, sample_rate, ',')} --> {_clock(b, sample_rate, ',')}\n{text}\n"
                  for n, ((a, b), text) in enumerate(cues, start=1)]
        return "\n".join(blocks)
    blocks = [f"{_clock(a, sample_rate, '.')} --> {_clock(b, sample_rate, '.')}\n{_vtt_escape(text)}\n"
              for (a, b), text in cues]
    return "\n".join(["WEBVTT\n", *blocks])


def cue_text(piece: str) -> str:
    """A piece as caption text: control tokens dropped, whitespace (newlines too: a blank line ends a cue) one space."""
    return " ".join(_TOKEN.sub(" ", piece).split())


def _clock(samples: int, sample_rate: int, point: str) -> str:
    ms = (samples * 1000 + sample_rate // 2) // sample_rate  # nearest millisecond, in integers
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    seconds, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{point}{ms:03d}"


def _vtt_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
