"""Text stage: scripts. `[voice: NAME]` and `[pause: 1.5s]` tags inside a text -> turns, each with its voice, and the
silences between them.

    Hello there. [pause: 500ms] [voice: echo] Hi! [voice: alloy(2)+1234(1)] [pause: 1.5s] Shall we begin?

A `[voice: NAME]` tag sets the voice of the text after it (any voice the `voice` field takes, blends included; text
before the first one speaks in the request's own voice). A `[pause: N s]` / `[pause: N ms]` tag is N of silence,
rounded once to whole samples (1.5 s at 24 kHz is 36000 samples exactly). Whitespace-only text between tags is no
turn; adjacent pauses add up. ChatTTS's own bracket tokens ([uv_break], [laugh], [speed_5], ...) are not script
tags and stay in the turn's text. Any bracket that starts with `voice` or `pause` as a word must be a well-formed
tag: a ValueError names the field and the tag otherwise.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

MAX_PAUSE_S = 60  # one [pause] tag
MAX_TOTAL_PAUSE_S = 600  # every pause of one script (silence costs memory, not the engine)
MAX_TURNS = 256  # turns of one script (each is a text of the batch)
_TAG = re.compile(r"\[\s*(voice|pause)\b([^\[\]]*)(\]|(?=\[)|$)", re.IGNORECASE)
_VALUE = re.compile(r"\s*[:=]\s*(.*?)\s*", re.DOTALL)
_DURATION = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*(ms|s)", re.IGNORECASE)


@dataclass(frozen=True)
class Turn:
    text: str  # the turn's words (ChatTTS's own tokens kept), stripped
    voice: str | None  # the voice tag in force, or None: the request's own voice
    pause_before: int  # samples of silence before the turn


@dataclass(frozen=True)
class Script:
    turns: list[Turn]  # in speaking order; at least one
    pause_after: int  # samples of silence after the last turn
    sample_rate: int

    @property
    def texts(self) -> list[str]:
        return [turn.text for turn in self.turns]


def is_script(text: str) -> bool:
    """Whether a text holds a script tag (or something that starts like one)."""
    return _TAG.search(text) is not None


def parse_script(text: str, sample_rate: int, field: str = "input") -> Script | None:
    """The text's turns and pauses, or None when it holds no script tag (a plain text, spoken as before). A malformed
    tag, a pause out of range or a script with nothing to say is a ValueError naming `field` and the tag."""
    if not is_script(text):
        return None
    turns: list[Turn] = []
    voice, pause, total, at = None, 0, 0, 0
    for match in _TAG.finditer(text):
        if _add_turn(turns, text[at : match.start()], voice, pause):
            pause = 0
        at = match.end()
        kind, value = _tag(match, field)
        if kind == "voice":
            voice = value
            continue
        samples = _pause_samples(value, sample_rate, match.group(0), field)
        pause, total = pause + samples, total + samples
        if total > MAX_TOTAL_PAUSE_S * sample_rate:
            raise ValueError(f"{field}: the pauses add up to more than {MAX_TOTAL_PAUSE_S} s; use fewer ones")
    if _add_turn(turns, text[at:], voice, pause):
        pause = 0
    if not turns:
        raise ValueError(f"{field}: the script holds only tags; give words to speak between them")
    if len(turns) > MAX_TURNS:
        raise ValueError(f"{field}: {len(turns)} turns is over the limit of {MAX_TURNS}; split the script")
    return Script(turns, pause, sample_rate)


def _add_turn(turns: list[Turn], words: str, voice: str | None, pause: int) -> bool:
    """Append the words between two tags as a turn (whitespace is none); whether a turn was added."""
    if words.strip():
        turns.append(Turn(words.strip(), voice, pause))
    return bool(words.strip())


def _tag(match: re.Match[str], field: str) -> tuple[str, str]:
    """(kind, value) of one tag; a ValueError names the tag as written."""
    tag, kind = match.group(0).strip(), match.group(1).lower()
    example = "[voice: alloy]" if kind == "voice" else "[pause: 1.5s] or [pause: 300ms]"
    if not match.group(3):
        raise ValueError(f"{field}: the tag {tag[:60]!r} is not closed with ']'; write it as {example}")
    value = _VALUE.fullmatch(match.group(2))
    if value is None or not value.group(1):
        raise ValueError(f"{field}: {tag[:60]!r} is not a script tag; write it as {example}")
    return kind, value.group(1)


def _pause_samples(value: str, sample_rate: int, tag: str, field: str) -> int:
    duration = _DURATION.fullmatch(value)
    if duration is None:
        raise ValueError(f"{field}: {tag[:60]!r} has no duration this reads; write [pause: 1.5s] or [pause: 300ms]")
    seconds = Decimal(duration.group(1)) / (1000 if duration.group(2).lower() == "ms" else 1)
    if seconds > MAX_PAUSE_S:
        raise ValueError(f"{field}: {tag[:60]!r} is longer than the {MAX_PAUSE_S} s one pause may last")
    return int((seconds * sample_rate).to_integral_value(ROUND_HALF_EVEN))
