"""Text stage: a subset of SSML -> the plain text and control tokens ChatTTS reads.

Supported (anything else is a ValueError "input: ... at line L column C"):
- `<speak>` (the root; `xml:lang="zh..."` makes say-as read in Chinese)
- `<break time="500ms|2s" strength="none|x-weak|weak|medium|strong|x-strong"/>`: ChatTTS has no timed silence,
  so a break becomes its nearest pause token: under 1 s or weak/medium -> `[uv_break]`, 1 s or more or
  strong/x-strong -> `[lbreak]`, 0 s or strength none -> nothing.
- `<prosody rate="x-slow|slow|medium|fast|x-fast|N%|N">`: a speed factor (0.5, 0.75, 1, 1.5, 2; "150%" = 1.5) for the
  whole input, as ChatTTS's `[speed_N]` prompt is per request; two different rates in one input are refused.
- `<say-as interpret-as="characters|spell-out|cardinal|number|date" format="ymd|mdy|dmy">`: letters spelled one by
  one, integers and dates read as words by the default normaliser (numbers.SpokenText).
- `<sub alias="...">`: the alias is spoken instead of the content.
Parsed with expat; a DTD (hence any entity definition) is refused, so there is no entity expansion.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn
from xml.parsers import expat

from chattts_velocity.text.normalizer import detect_language
from chattts_velocity.text.spoken_rules import MAX_CARDINAL_DIGITS, spell_digits

if TYPE_CHECKING:
    from chattts_velocity.text.numbers import SpokenText

RATES = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "default": 1.0, "fast": 1.5, "x-fast": 2.0}
RATE_RANGE = (0.25, 4.0)
STRENGTHS = {"none": "", "x-weak": "[uv_break]", "weak": "[uv_break]", "medium": "[uv_break]",
             "strong": "[lbreak]", "x-strong": "[lbreak]"}
LONG_BREAK_MS = 1000
SAY_AS = ("characters", "spell-out", "cardinal", "number", "date")
_TIME = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*")
_INTEGER = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+|[+-]?\d+")
_DATE = re.compile(r"(\d{1,4})[-/.](\d{1,2})[-/.](\d{1,4})")
ATTRIBUTES = {"speak": {"version", "xmlns", "xml:lang", "xmlns:xsi", "xsi:schemaLocation"},
              "break": {"time", "strength"}, "prosody": {"rate"}, "say-as": {"interpret-as", "format"},
              "sub": {"alias"}}


@dataclass
class SsmlText:
    text: str  # plain text with [uv_break] / [lbreak] tokens, say-as content already read as words
    rate: float | None = None  # <prosody rate> as a speed factor (1.0 normal), None when not given


def is_ssml(text: str) -> bool:
    return text.lstrip().startswith(("<speak", "<?xml"))


def parse_ssml(source: str) -> SsmlText:
    """SSML -> SsmlText; malformed or unsupported markup is a ValueError naming `input` and the position."""
    parser = expat.ParserCreate()
    reader = _Reader(source, parser)
    parser.StartDoctypeDeclHandler = lambda *_: reader.fail("a DTD is not allowed")
    parser.EntityDeclHandler = lambda *_: reader.fail("entity declarations are not allowed")
    parser.StartElementHandler, parser.EndElementHandler = reader.start, reader.end
    parser.CharacterDataHandler = reader.data
    try:
        parser.Parse(source, True)
    except expat.ExpatError as exc:
        raise ValueError(f"input: malformed SSML ({expat.errors.messages[exc.code]}) at line {exc.lineno} "
                         f"column {exc.offset + 1}") from None
    return SsmlText(_tidy("".join(reader.parts)), reader.rate)


def _tidy(text: str) -> str:
    """One space between words; none before punctuation, nor (in Chinese) around characters and tokens."""
    text = re.sub(r"\s+([,.!?;:，。！？；：])", r"\1", re.sub(r"\s+", " ", text)).strip()
    if detect_language(text) == "zh":
        text = re.sub(r"(?<=[^\x00-\x7f]|\]) (?=[^\x00-\x7f]|\[)", "", text)
    return text


@dataclass
class _Reader:
    source: str
    parser: expat.XMLParserType
    parts: list[str] = field(default_factory=list)
    stack: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    held: list[str] = field(default_factory=list)  # the text inside a say-as or sub, used at its end
    rate: float | None = None
    lang: str | None = None

    def fail(self, why: str) -> NoReturn:
        line, column = self.parser.CurrentLineNumber, self.parser.CurrentColumnNumber + 1
        raise ValueError(f"input: {why} at line {line} column {column}")

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        if tag not in ATTRIBUTES:
            self.fail(f"<{tag}> is not supported SSML here; use {', '.join(f'<{t}>' for t in ATTRIBUTES)}")
        if (tag == "speak") != (not self.stack):
            self.fail("<speak> must be the root element" if tag != "speak" else "<speak> cannot be nested")
        if self.stack and self.stack[-1][0] in ("say-as", "sub"):
            self.fail(f"<{self.stack[-1][0]}> holds text only, not <{tag}>")
        unknown = sorted(set(attrs) - ATTRIBUTES[tag])
        if unknown:
            self.fail(f"<{tag}> has unsupported attribute(s) {unknown}; it takes {sorted(ATTRIBUTES[tag])}")
        getattr(self, "_start_" + tag.replace("-", "_"), lambda a: None)(attrs)
        self.stack.append((tag, attrs))
        self.held = []

    def end(self, tag: str) -> None:
        _, attrs = self.stack.pop()
        if tag == "say-as":
            self.parts.append(f" {self._say_as(''.join(self.held), attrs)} ")
        elif tag == "sub":
            self.parts.append(attrs["alias"])

    def data(self, text: str) -> None:
        (self.held if self.stack and self.stack[-1][0] in ("say-as", "sub") else self.parts).append(text)

    def _start_speak(self, attrs: dict[str, str]) -> None:
        self.lang = "zh" if attrs.get("xml:lang", "").lower().startswith("zh") else None

    def _start_break(self, attrs: dict[str, str]) -> None:
        token = STRENGTHS.get(attrs.get("strength", "medium"))
        if token is None:
            self.fail(f"<break strength={attrs['strength']!r}> is not one of {list(STRENGTHS)}")
        if "time" in attrs:
            token = self._break_for_time(attrs["time"])
        self.parts.append(f" {token} " if token else " ")

    def _break_for_time(self, value: str) -> str:
        match = _TIME.fullmatch(value)
        if match is None:
            self.fail(f"<break time={value!r}> must look like '500ms' or '2s'")
        ms = float(match.group(1)) * (1 if match.group(2) == "ms" else 1000)
        return "" if ms == 0 else "[uv_break]" if ms < LONG_BREAK_MS else "[lbreak]"

    def _start_prosody(self, attrs: dict[str, str]) -> None:
        if "rate" not in attrs:
            self.fail("<prosody> needs a rate (pitch and volume are not supported)")
        rate = self._rate(attrs["rate"].strip().lower())
        if self.rate is not None and rate != self.rate:
            self.fail(f"a second <prosody rate> ({rate} after {self.rate}); ChatTTS takes one speed per request")
        self.rate = rate

    def _rate(self, value: str) -> float:
        try:
            rate = RATES[value] if value in RATES else float(value[:-1]) / 100 if value.endswith("%") else float(value)
        except ValueError:
            rate = -1.0
        if not RATE_RANGE[0] <= rate <= RATE_RANGE[1]:
            self.fail(f"<prosody rate={value!r}> must be one of {list(RATES)} or a factor in {RATE_RANGE} "
                      "(e.g. '150%' or '1.5')")
        return rate

    def _start_say_as(self, attrs: dict[str, str]) -> None:
        if attrs.get("interpret-as") not in SAY_AS:
            self.fail(f"<say-as interpret-as={attrs.get('interpret-as')!r}> must be one of {list(SAY_AS)}")

    def _start_sub(self, attrs: dict[str, str]) -> None:
        if not attrs.get("alias", "").strip():
            self.fail("<sub> needs a non-empty alias")

    def _say_as(self, content: str, attrs: dict[str, str]) -> str:
        kind, content = attrs["interpret-as"], content.strip()
        lang = self.lang or detect_language("".join(self.parts) + content)
        if kind in ("characters", "spell-out"):
            return spell_digits(" ".join(c for c in content if not c.isspace()), lang)
        if kind in ("cardinal", "number"):
            if not _INTEGER.fullmatch(content):
                self.fail(f"<say-as interpret-as={kind!r}> holds {content[:40]!r}, not an integer")
            if sum(c.isdigit() for c in content) > MAX_CARDINAL_DIGITS:
                self.fail(f"<say-as interpret-as={kind!r}> holds a {sum(c.isdigit() for c in content)}-digit number; "
                          f"numbers of up to {MAX_CARDINAL_DIGITS} digits are read as numbers (spell longer ones "
                          "out with interpret-as='characters')")
            return _spoken(f"{int(content.replace(',', '')):,}" if lang == "en" else content.replace(",", ""), lang)
        return _spoken(self._iso_date(content, attrs.get("format", "ymd")), lang)

    def _iso_date(self, content: str, order: str) -> str:
        match = _DATE.fullmatch(content)
        if match is None or order not in ("ymd", "mdy", "dmy"):
            self.fail(f"<say-as interpret-as='date'> holds {content!r}; write it as 2024-03-05 (format ymd, mdy or "
                      "dmy)")
        parts = dict(zip(order, (int(g) for g in match.groups()), strict=True))
        if not (1 <= parts["m"] <= 12 and 1 <= parts["d"] <= 31 and parts["y"] >= 1):
            self.fail(f"<say-as interpret-as='date'> holds {content!r}, not a date in the {order} order")
        return f"{parts['y']:04d}-{parts['m']:02d}-{parts['d']:02d}"


def _spoken(text: str, lang: str) -> str:
    """Numbers and dates as words through the default normaliser (left as digits for it if wetext is missing)."""
    try:
        return _reader(lang).read(text, lang)
    except ImportError:
        return text


@functools.lru_cache(maxsize=2)
def _reader(lang: str) -> SpokenText:
    from chattts_velocity.text.numbers import SpokenText

    return SpokenText(lang)
