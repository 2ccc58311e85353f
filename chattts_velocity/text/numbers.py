"""Text stage: numbers, dates, times, money, units and symbols read aloud (the default zh/en normalisers).

In: one plain segment of a sentence (no [tags]). Out: the same text with every digit and symbol as
words, e.g. "价格是25元，时间是2024年3月5日" -> "价格是二十五元，时间是二零二四年三月五日",
"$3.50 at 10:30am" -> "three dollars fifty cents at ten thirty a m".

The reading is done by wetext (Apache-2.0, pip `wetext`), the runtime of WeTextProcessing, whose
Chinese normaliser is the one upstream ChatTTS suggests. It runs WeTextProcessing's compiled
grammars (zh and en TN) with kaldifst: a 5 MB wheel, about 50 MB installed with its dependencies
(kaldifst, contractions), wheels for every platform, no pynini. Chosen over
- WeTextProcessing itself (same grammars, needs pynini: a 165 MB wheel, 740 MB installed);
- NeMo text processing (pynini too, plus a heavy NeMo stack);
- cn2an (MIT) + num2words (LGPL): light, but they only spell numbers; dates, times, money, units,
  phone numbers and symbols would be our own grammar, and cn2an's sentence mode misreads times,
  phone numbers, units and "1,234" (measured on the Chinese sentences of tests/text/test_numbers.py).
wetext's slips we measured ("¥350万", "第2名", "$1,200", "1000", "+1 800…", "1990s") are corrected
around it in spoken_rules.py. Mixed sentences are read run by run: a whitespace-separated chunk that
holds a Chinese character is read as Chinese ("3点30分", "25元"), one with Latin letters as English,
and numbers alone go with the chunk before them.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable

from chattts_velocity.text.budget import check_budget
from chattts_velocity.text.plain_numbers import read_en_span
from chattts_velocity.text.spoken_rules import after_wetext, before_wetext
from chattts_velocity.text.wetext_spans import WetextMemo, wetext_spans
from chattts_velocity.text.zh_numbers import read_zh_span

logger = logging.getLogger(__name__)

LANGUAGES = ("zh", "en")
_CJK = re.compile(r"[\u4e00-\u9fff\u3000-\u303f\uff01-\uffee]")  # Chinese, CJK and full-width marks
_LATIN = re.compile(r"[A-Za-z]")
_SPACE_SPLIT = re.compile(r"(\s+)")
_LAST_SPACE = re.compile(r".*\s", re.DOTALL)
_MARKS_ONLY = re.compile(r"[,.;:!?，。、；：！？]+")
# wetext's FST search grows faster than its input (measured: 4 ms at 32 characters, 18 ms at 128, 110 ms at 512),
# so it reads at most this many characters a call: a text costs time in proportion to its length
MAX_WETEXT_CHARS = 64


class SpokenText:
    """The str -> str normaliser for sentences detected as `lang`; mixed runs use the other language.

    Raises ImportError when wetext is not installed (the Normalizer then keeps upstream's behaviour).
    """

    def __init__(self, lang: str) -> None:
        if lang not in LANGUAGES:
            raise ValueError(f"lang: expected one of {LANGUAGES}, got {lang!r}")
        from wetext import Normalizer as Wetext

        self.lang = lang
        self._memo = {name: WetextMemo(Wetext(lang=name, operator="tn").normalize) for name in LANGUAGES}

    def __call__(self, text: str) -> str:
        return "".join(self.read(run, lang) for lang, run in language_runs(text, self.lang))

    def forget(self) -> None:
        """Empty the memo of wetext's readings (benchmarks measure a text's cost from scratch)."""
        for memo in self._memo.values():
            memo.clear()

    def read(self, text: str, lang: str) -> str:
        """One language run: rewrites wetext needs, wetext, then its fixes; edge spaces are kept."""
        core = text.strip()
        if not core:
            return text
        prepared = before_wetext(core, lang, lambda piece: self.say(piece, lang))
        spoken = after_wetext(self.say(prepared, lang), lang, core)
        return text[: len(text) - len(text.lstrip())] + spoken + text[len(text.rstrip()):]

    def say(self, text: str, lang: str) -> str:
        """wetext's reading of the parts of `text` it must read (wetext_spans); the rest is kept as it is."""
        return "".join(_keep_edges(piece, lambda core: self._say_bounded(core, lang)) if hot else piece
                       for piece, hot in wetext_spans(text, lang, lambda word: self._memo[lang](word) == word))

    def _say_bounded(self, text: str, lang: str) -> str:
        """wetext's reading; a longer text than MAX_WETEXT_CHARS is read in chunks cut at whitespace."""
        if len(text) <= MAX_WETEXT_CHARS:
            return self._say_chunk(text, lang)
        return "".join(_keep_edges(chunk, lambda core: self._say_chunk(core, lang))
                       for chunk in bounded_chunks(text, MAX_WETEXT_CHARS))

    def _say_chunk(self, text: str, lang: str) -> str:
        """wetext's reading of a short text; where its grammar fails on it, each word is read on its own. Plain numbers
        among neutral words are read without wetext (plain_numbers, zh_numbers: the same words, 100 times faster)."""
        check_budget()
        spoken = read_zh_span(text) if lang == "zh" else read_en_span(text)
        if spoken is None:
            spoken = self._memo[lang](text)
        if spoken is not None:
            return spoken
        logger.debug("wetext %s failed on %r; reading word by word", lang, text)
        return "".join(self._say_word(word, lang) for word in _SPACE_SPLIT.split(text))

    def _say_word(self, word: str, lang: str) -> str:
        if not word or word.isspace() or _MARKS_ONLY.fullmatch(word):
            return word  # wetext reads marks as themselves (or fails on them): no call needed
        return self._memo[lang](word) or word


def _keep_edges(text: str, read: Callable[[str], str]) -> str:
    core = text.strip()
    return text[: len(text) - len(text.lstrip())] + read(core) + text[len(text.rstrip()):] if core else text


def bounded_chunks(text: str, limit: int) -> list[str]:
    """`text` as consecutive pieces of at most `limit` characters that join back to it, each cut after the last
    whitespace of its window (anywhere in a window without whitespace)."""
    chunks, start = [], 0
    while len(text) - start > limit:
        space = _LAST_SPACE.match(text, start, start + limit)
        end = space.end() if space is not None else start + limit
        chunks.append(text[start:end])
        start = end
    return chunks + [text[start:]] if start < len(text) else chunks


def language_runs(text: str, default: str) -> list[tuple[str, str]]:
    """Split `text` into (lang, run) pieces, in order, that join back to `text`.

    A whitespace-separated chunk holding a CJK character is "zh", else one holding a Latin letter
    is "en"; chunks without letters (numbers, symbols) and spaces join the run before them (the
    first run's language when they lead, `default` when the text has no letters at all).
    """
    chunks = [c for c in _SPACE_SPLIT.split(text) if c]
    langs = [_chunk_language(c) for c in chunks]
    known = [lang for lang in langs if lang is not None]
    current = known[0] if known else default
    runs: list[tuple[str, str]] = []
    for chunk, lang in zip(chunks, langs, strict=True):
        current = lang or current
        if runs and runs[-1][0] == current:
            runs[-1] = (current, runs[-1][1] + chunk)
        else:
            runs.append((current, chunk))
    return runs


def _chunk_language(chunk: str) -> str | None:
    if _CJK.search(chunk):
        return "zh"
    return "en" if _LATIN.search(chunk) else None
