"""Text stage: normalisation. Raw user text -> sentences, and sentence -> text the tokenizer reads well.

Implements ChatTTS's Normalizer and its sentence splitting (which upstream runs before normalising); deviations are
noted where they occur. Deviations by design: numbers and symbols are read aloud by default (numbers.py), and
punctuation outside the accepted class is mapped, not deleted (punctuation.py); whatever is still
dropped is named in a warning.
"""
from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from itertools import zip_longest
from pathlib import Path
from typing import Literal

from chattts_velocity.text.numbers import SpokenText
from chattts_velocity.text.punctuation import fold_punctuation, rejected_characters, strip_rejected

HOMOPHONES_PATH = Path(__file__).parent / "res" / "homophones.tsv"
logger = logging.getLogger(__name__)


def warn_dropped(characters: set[str]) -> None:
    """The one warning that names the characters a text lost (once per call or request)."""
    if characters:
        logger.warning("dropped characters the model cannot read: %s", " ".join(sorted(characters)))

_TAG = re.compile(r"\[[\w_]+\]")
_CJK_CHAR = re.compile(r"[\u4e00-\u9fff]")
_EN_WORD = re.compile(r"\b[A-Za-z]+\b")
_SENTENCE_END = re.compile(r"(?<=。)|(?<=\.\s)")  # zero-width: the end mark stays with the left piece
# zh only; "[", "]" and "_" are kept so [tags] survive.
_HALF_TO_FULL = str.maketrans(
    "!\"'#$%&(),-*+./:;<=>?@\\^`{|}~",
    "！“‘＃＄％＆（），－＊＋。／：；＜＝＞？＠＼＾｀｛｜｝～",
)
_PROBE = "test string 测试字符串"
Builder = Callable[[], Callable[[str], str]]  # makes a language normaliser; ImportError when not installed
_warned_missing: set[str] = set()  # languages whose "install wetext" warning was given (once a process)


class Normalizer:
    """Upstream's text normaliser: per-language normalisers, punctuation and homophone maps.

    `normalizers` maps a language ("zh", "en", ...) to a str -> str function applied to the text
    between [tags]. With `load_defaults`, zh and en get numbers.SpokenText (wetext), or upstream's
    WeTextProcessing (zh) / NeMo (en) when only those are installed; upstream registers none by default.
    """

    def __init__(self, homophones: str | Path = HOMOPHONES_PATH, *, load_defaults: bool = True) -> None:
        self.normalizers: dict[str, Callable[[str], str]] = {}
        self.homophones = load_homophones(homophones)  # {ord(source): ord(target)}
        if load_defaults:
            self.register_default_normalizers()

    def __call__(
        self,
        text: str,
        do_text_normalization: bool = True,
        do_homophone_replacement: bool = True,
        lang: str | None = None,
        *,
        dropped: set[str] | None = None,
    ) -> str:
        """Normalise one sentence. Deviation: "" gives "" (upstream raises IndexError with a normaliser).

        Characters the model cannot read are removed and named in a warning, or added to `dropped` for the caller to
        name once for a whole request (warn_dropped)."""
        if not isinstance(text, str):
            raise ValueError(f"text: expected a str, got {type(text).__name__}")
        if do_text_normalization:
            text = self._normalize(text, detect_language(text) if lang is None else lang)
        if invalid_characters(text):
            text = map_plain_segments(text, fold_punctuation)
        if do_homophone_replacement:
            text = self.replace_homophones(text)
        unreadable = invalid_characters(text)
        if unreadable:
            if dropped is None:
                warn_dropped(unreadable)
            else:
                dropped.update(unreadable)
            text = map_plain_segments(text, strip_rejected)
        return text

    def _normalize(self, text: str, lang: str) -> str:
        if lang in self.normalizers:
            text = map_plain_segments(text, self.normalizers[lang])
        if lang == "zh":
            text = text.translate(_HALF_TO_FULL)
        return text

    def replace_homophones(self, text: str) -> str:
        """One left-to-right pass of the character map; a replaced character is not looked up again."""
        if logger.isEnabledFor(logging.INFO):
            pairs = [f"{c}->{chr(self.homophones[ord(c)])}" for c in text if ord(c) in self.homophones]
            if pairs:
                logger.info("replace homophones: %s", ", ".join(pairs))
        return text.translate(self.homophones)

    def register(self, name: str, normalizer: Callable[[str], str]) -> bool:
        """Add a language normaliser; False (with a warning) on a duplicate name or a bad function."""
        if name in self.normalizers:
            logger.warning("normalizer %r is already registered", name)
            return False
        try:
            result = normalizer(_PROBE)
        except Exception as e:  # any failure of user code means "not registered", as upstream
            logger.warning("normalizer %r failed on %r: %s", name, _PROBE, e)
            return False
        if not isinstance(result, str):
            logger.warning("normalizer %r must map str -> str, returned %s", name, type(result).__name__)
            return False
        self.normalizers[name] = normalizer
        return True

    def unregister(self, name: str) -> None:
        self.normalizers.pop(name, None)

    def register_default_normalizers(self) -> list[str]:
        """Register zh and en (the first of their builders that loads); returns the names added now."""
        added, missing = [], []
        for name, builders in _DEFAULT_BUILDERS.items():
            if name in self.normalizers:
                continue
            fn = _first_loadable(name, builders)
            if fn is None:
                missing.append(name)
            elif self.register(name, fn):
                added.append(name)
        _warn_missing_once(missing)
        return added


def _first_loadable(name: str, builders: tuple[Builder, ...]) -> Callable[[str], str] | None:
    for build in builders:
        try:
            return build()
        except ImportError as e:
            logger.debug("no %s normalizer from %s: %s", name, build.__name__, e)
        except Exception as e:  # a broken optional install must not break text processing
            logger.warning("the %s normalizer %s failed to load: %s", name, build.__name__, e)
    return None


def _warn_missing_once(names: list[str]) -> None:
    new = [name for name in names if name not in _warned_missing]
    if new:
        _warned_missing.update(new)
        logger.warning("numbers and symbols in %s text are not read aloud (their digits are dropped): "
                       "install the `wetext` package (pip install wetext)", " and ".join(new))


def _spoken_zh() -> Callable[[str], str]:
    return SpokenText("zh")


def _spoken_en() -> Callable[[str], str]:
    return SpokenText("en")


def _wetextprocessing_zh() -> Callable[[str], str]:
    from tn.chinese.normalizer import Normalizer as ZhNormalizer

    normalize: Callable[[str], str] = ZhNormalizer(remove_interjections=False).normalize  # tn is untyped
    return normalize


def _nemo_en() -> Callable[[str], str]:
    from nemo_text_processing.text_normalization.normalize import Normalizer as EnNormalizer

    normalizer = EnNormalizer(input_case="cased", lang="en")
    return functools.partial(normalizer.normalize, verbose=False, punct_post_process=True)


_DEFAULT_BUILDERS = {"zh": (_spoken_zh, _wetextprocessing_zh), "en": (_spoken_en, _nemo_en)}


def load_homophones(path: str | Path) -> dict[int, int]:
    """The homophone table (`source<TAB>target` lines, '#' comments) as a str.translate map."""
    table: dict[int, int] = {}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        pair = line.split("\t")
        if len(pair) != 2 or len(pair[0]) != 1 or len(pair[1]) != 1:
            raise ValueError(f"homophones: {path}:{number} is not 'source<TAB>target' (one character each)")
        table.setdefault(ord(pair[0]), ord(pair[1]))  # first entry wins, as upstream's lookup
    return table


def detect_language(text: str) -> Literal["zh", "en"]:
    """ "zh" when CJK characters outnumber English words, else "en" (ties go to "en")."""
    return "zh" if len(_CJK_CHAR.findall(text)) > len(_EN_WORD.findall(text)) else "en"


def invalid_characters(text: str) -> set[str]:
    """Characters outside Chinese, ASCII letters, ，。、,. , space and in-word "'", ignoring [tags]."""
    return rejected_characters(_TAG.sub("", text))


def split_tags(text: str) -> tuple[list[str], list[str]]:
    """Split into plain segments and [tags]: texts[i] precedes tags[i], so len(tags) <= len(texts).

    Every "[" opens a tag (the text before it is kept, even if empty) that runs to the next "]";
    an unterminated "[..." tail, or a tag interrupted by another "[", is dropped, as upstream.
    Deviation: a "]" outside a tag is plain text; upstream records an empty tag there, which moves
    later tags one segment to the right when recombined.
    """
    texts: list[str] = []
    tags: list[str] = []
    plain, tag = "", None  # tag is None outside a tag
    for c in text:
        if c == "[":
            texts.append(plain)
            plain, tag = "", c
        elif tag is None:
            plain += c
        else:
            tag += c
            if c == "]":
                tags.append(tag)
                tag = None
    if plain:
        texts.append(plain)
    return texts, tags


def combine_tags(texts: list[str], tags: list[str]) -> str:
    """Inverse of split_tags: each plain segment followed by its tag."""
    return "".join(t + g for t, g in zip_longest(texts, tags, fillvalue=""))


def map_plain_segments(text: str, fn: Callable[[str], str]) -> str:
    """Apply `fn` to the text between [tags] (empty segments included) and recombine."""
    texts, tags = split_tags(text)
    return combine_tags([fn(t) for t in texts], tags)


def split_text(text: str) -> list[str]:
    """Upstream's sentence splitting, done before normalisation, as upstream orders them.

    With a "\\n" the text is split into lines; otherwise after every "。" and after every "."
    followed by one whitespace character (which stays with the left piece).
    Deviation: empty and whitespace-only pieces are dropped in both cases; upstream keeps empty
    lines, and each one would be synthesised as a prompt with no text.
    """
    if not isinstance(text, str):
        raise ValueError(f"text: expected a str, got {type(text).__name__}")
    pieces = text.split("\n") if "\n" in text else _SENTENCE_END.split(text)
    return [p for p in pieces if p.strip()]
