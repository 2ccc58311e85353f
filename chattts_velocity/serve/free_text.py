"""Serving stage: the controls written out in free-text `instructions`, and the report of what a request applied.

OpenAI takes any text up to 4096 characters ("Speak slowly and cheerfully."). A clause outside the grammar of
serve/instructions.py is read conservatively, for two things only:
  - control tokens anywhere in it: [speed_N], [oral_N], [laugh_N], [break_N]
  - one speed word, as a whole word: "very slow(ly)" 1, "slow", "slowly", "slower" 3, "fast", "faster", "quick",
    "quickly" 7, "very fast" / "very quick(ly)" 9; not in a clause that also says not, no, never, don't, without,
    too or avoid ("not too fast" sets nothing)
Tone, emotion, accent and the rest have no ChatTTS control and are ignored. What was applied and what ignored goes
back in response headers (and the server log at info).
"""
from __future__ import annotations

import re

APPLIED_HEADER = "x-chattts-instructions-applied"
IGNORED_HEADER = "x-chattts-instructions-ignored"
MAX_HEADER_CHARS = 256

_TOKEN = re.compile(r"\[(speed|oral|laugh|break)_(\d+)\]")
_SPEED_WORDS = (  # the first that matches is the clause's speed
    (re.compile(r"\bvery (?:slow|slowly)\b"), 1),
    (re.compile(r"\bvery (?:fast|quick|quickly)\b"), 9),
    (re.compile(r"\b(?:slow|slowly|slower)\b"), 3),
    (re.compile(r"\b(?:fast|faster|quick|quickly)\b"), 7),
)
_QUALIFIED = re.compile(r"\b(?:not|no|never|don't|dont|without|too|avoid)\b")


def free_text_levels(clause: str) -> list[tuple[str, int]]:
    """(control, level) pairs a lower-cased free-text clause writes out, in order; [] for none."""
    levels = [(m.group(1), int(m.group(2))) for m in _TOKEN.finditer(clause)]
    if _QUALIFIED.search(clause):
        return levels
    speed = next((level for pattern, level in _SPEED_WORDS if pattern.search(clause)), None)
    return levels if speed is None else [*levels, ("speed", speed)]


def report_headers(applied: tuple[str, ...], ignored: tuple[str, ...]) -> dict[str, str]:
    """The response headers of a request that gave instructions ({} for one that gave none)."""
    if not applied and not ignored:
        return {}
    headers = {APPLIED_HEADER: ", ".join(applied) or "none"}
    if ignored:
        headers[IGNORED_HEADER] = header_text("; ".join(ignored))
    return headers


def header_text(text: str) -> str:
    """text as a header value: printable ASCII (others escaped as \\xXX or \\uXXXX), at most MAX_HEADER_CHARS."""
    safe = "".join(c if " " <= c <= "~" else c.encode("unicode_escape").decode() for c in text)
    return safe if len(safe) <= MAX_HEADER_CHARS else safe[:MAX_HEADER_CHARS - 3] + "..."
