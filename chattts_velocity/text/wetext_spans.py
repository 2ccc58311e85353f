"""Text stage: which parts of a language run wetext must read, and a memo of its readings.

wetext's FST search costs tens of microseconds per character, whatever the character, so reading every sentence
through it made plain prose cost over 100 ms of CPU per 1,000 characters. Most of a sentence reads as itself:
- English: a lowercase word ("fox", "don't", "fox.") is never rewritten by wetext; a capitalised or upper-case
  word is plain when wetext reads it alone as itself ("Smith" is, "Mon" and "Sun" are not: they become days), asked
  once per word. Anything else (digits, symbols, quotes, a word wetext rewrites) is read by wetext with `REACH`
  words of context on each side ("May 5, 2024", "5 pm", "World War II").
- Chinese: Chinese characters and marks read as themselves (wetext's zh grammar leaves them whole); a run of
  digits, letters or symbols is read by wetext with `ZH_REACH` characters of its clause (up to one of ，。！？；：、)
  on each side ("2024年3月5日", "第2名", "25元").
`WetextMemo` keeps the latest readings (a text repeated in a request or across requests costs one lookup).
"""
from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable

REACH = 2  # words of context wetext sees on each side of a word it must read
ZH_REACH = 3  # characters of context wetext sees on each side of a Chinese clause's digits, letters or symbols
MEMO_SIZE = 8192  # readings kept (texts of at most numbers.MAX_WETEXT_CHARS characters)
_WORD = re.compile(r"\S+")
_LOWER_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?[,.;:!?]?")
_LETTER_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?[,.;:!?]?")
_CLAUSE_END = re.compile(r"(?<=[，。！？；：、])")
_ZH_FOREIGN = re.compile(r"[^\u4e00-\u9fff，。！？；：、“”‘’（）《》〈〉「」『』…—\s]+")
Span = tuple[str, bool]  # a piece of the run, and whether wetext must read it


class WetextMemo:
    """`read(text)` through a bounded least-recently-used memo; a reading that raised is remembered as None."""

    def __init__(self, read: Callable[[str], str], size: int = MEMO_SIZE) -> None:
        self._read, self._size = read, size
        self._seen: OrderedDict[str, str | None] = OrderedDict()

    def __call__(self, text: str) -> str | None:
        if text in self._seen:
            self._seen.move_to_end(text)
            return self._seen[text]
        try:
            reading: str | None = self._read(text)
        except Exception:  # noqa: BLE001 - wetext asserts on some inputs ("+1", "100€"); the caller falls back
            reading = None
        self._seen[text] = reading
        if len(self._seen) > self._size:
            self._seen.popitem(last=False)
        return reading

    def clear(self) -> None:
        self._seen.clear()


def wetext_spans(text: str, lang: str, reads_as_itself: Callable[[str], bool]) -> list[Span]:
    """`text` as consecutive (piece, wetext must read it) spans that join back to it."""
    if lang == "zh":
        return _merge([span for clause in _CLAUSE_END.split(text) if clause for span in _zh_spans(clause)])
    words = list(_WORD.finditer(text))
    hot = [not _plain_word(m.group(0), reads_as_itself) for m in words]
    near = [any(hot[max(0, i - REACH): i + REACH + 1]) for i in range(len(words))]
    spans: list[Span] = []
    start = 0
    for i, m in enumerate(words):  # each word with the spaces before it; the tail spaces go last
        spans.append((text[start:m.end()], near[i]))
        start = m.end()
    spans.append((text[start:], False))
    return _merge([span for span in spans if span[0]])


def _zh_spans(clause: str) -> list[Span]:
    """A clause's characters other than Chinese and marks (digits, letters, symbols), each run with ZH_REACH
    characters of the clause on each side, are read; the rest of the clause is kept."""
    hot = [False] * len(clause)
    for m in _ZH_FOREIGN.finditer(clause):
        for i in range(max(0, m.start() - ZH_REACH), min(len(clause), m.end() + ZH_REACH)):
            hot[i] = True
    return [(clause[i], hot[i]) for i in range(len(clause))]


def _plain_word(word: str, reads_as_itself: Callable[[str], bool]) -> bool:
    if _LOWER_WORD.fullmatch(word):
        return True
    return _LETTER_WORD.fullmatch(word) is not None and reads_as_itself(word)


def _merge(spans: list[Span]) -> list[Span]:
    runs: list[tuple[list[str], bool]] = []
    for piece, hot in spans:
        if runs and runs[-1][1] == hot:
            runs[-1][0].append(piece)
        else:
            runs.append(([piece], hot))
    return [("".join(pieces), hot) for pieces, hot in runs]
