"""Text stage: fit normalised text to the characters the GPT reads (upstream's accepted class).

In: a normalised plain segment (no [tags]). Out: the same text with every other character mapped
to an accepted mark; what cannot be mapped is found here and dropped by the caller, which names it.

Upstream keeps Chinese, ASCII letters, "，。、,. " and spaces, maps a few brackets and colons to
commas and deletes everything else without a word. We keep that class (it is what the model reads
reliably), add the apostrophe inside English words (the tokenizer has "'", and "let's", "don't",
"we'll" are other words without it), and map punctuation to the nearest accepted mark instead of
deleting it: sentence ends (? ! …) to "。"/".", pauses (: ; brackets, quotes, dashes) to "，"/",".
Runs of marks that the mapping creates collapse into the strongest one.
"""
from __future__ import annotations

import re

_REJECTED = re.compile(r"(?:(?<=[A-Za-z])'(?=[A-Za-z]))|([^\u4e00-\u9fffA-Za-z，。、,. ])")
_WORD_APOSTROPHE = re.compile(r"(?<=[A-Za-z])['‘’`´](?=[A-Za-z])")
_QUOTE_APOSTROPHE = re.compile(r"(?<![A-Za-z])'|'(?![A-Za-z])")
_WORD_HYPHEN = re.compile(r"(?<=[A-Za-z])[-‐‑–](?=[A-Za-z])")
_SPACES = re.compile(r"[\t\n\r\f\v\u00a0\u3000]")
_MARK_RUN = re.compile(r"[，。、,.][\s，。、,.]*[，。、,.]")  # two or more marks

# Full-width (and CJK) marks become full-width commas and full stops, ASCII ones ASCII.
_TO_COMMA_ZH = "：；（）【】『』「」《》〈〉〔〕［］｛｝－～／＼｜〃"
_TO_STOP_ZH = "！？"
_TO_COMMA_EN = ":;()<>[]{}-~\"/\\|"  # and "'" outside a word
_TO_STOP_EN = "!?"
_FOLD = str.maketrans(
    _TO_COMMA_ZH + _TO_STOP_ZH + _TO_COMMA_EN + _TO_STOP_EN,
    "，" * len(_TO_COMMA_ZH) + "。" * len(_TO_STOP_ZH) + "," * len(_TO_COMMA_EN) + "." * len(_TO_STOP_EN),
)
# Quotes, dashes and ellipses serve both scripts: full-width in text with Chinese, ASCII otherwise.
_SHARED = "“”‘’«»—―–·…"
_FOLD_SHARED = {True: str.maketrans(_SHARED, "，，，，，，，，，，。"), False: str.maketrans(_SHARED, ",,,,,,,,,,.")}
_CJK = re.compile(r"[\u4e00-\u9fff]")
_SPACE_BEFORE_MARK = re.compile(r" +([,.])(?=([^\s,.]?))")


def rejected_characters(text: str) -> set[str]:
    """Characters of `text` outside the accepted class (an apostrophe inside a word is accepted)."""
    return {m.group(1) for m in _REJECTED.finditer(text) if m.group(1)}


def fold_punctuation(text: str) -> str:
    """Map marks outside the accepted class to "，。" or ",." and collapse the runs this makes."""
    text = _WORD_APOSTROPHE.sub("'", text)
    text = _QUOTE_APOSTROPHE.sub(",", _WORD_HYPHEN.sub(" ", text))
    text = _SPACES.sub(" ", text).translate(_FOLD).translate(_FOLD_SHARED[bool(_CJK.search(text))])
    return _SPACE_BEFORE_MARK.sub(_mark_then_space, _MARK_RUN.sub(_strongest_mark, text))


def _strongest_mark(run: re.Match[str]) -> str:
    """One mark for a run of marks: a full stop beats a comma; full-width if any mark was."""
    marks = run.group(0)
    full_width = any(c in "，。、" for c in marks)
    stop = any(c in "。." for c in marks)
    mark = ("。" if stop else "，") if full_width else ("." if stop else ",")
    return mark + (" " if not full_width and " " in marks else "")


def _mark_then_space(m: re.Match[str]) -> str:
    """ "known ,famous" -> "known, famous"; "dash ," -> "dash,"."""
    return m.group(1) + (" " if m.group(2) else "")


def strip_rejected(text: str) -> str:
    """Delete every character outside the accepted class (the caller warns, naming them)."""
    return _REJECTED.sub(lambda m: "" if m.group(1) else m.group(0), text)
