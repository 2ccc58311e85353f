"""Text stage: wetext's own English readings of plain numbers, without its FST search (about 2 ms a number).

A plain number is a whole word: an integer without a leading zero ("42", "1990", "0"), a percentage ("73%") or a
clock time ("7:43"), with at most one of , . ! ? after it. Its reading is wetext's, word for word, slips included
("1000" -> "ten hundred", "1001" -> "ten zero one": after_wetext mends them as it mends wetext's): a four-digit
integer from 1000 to 2999 is read as a year, any other integer (and a percentage's) as a cardinal.
Context can change a reading ("5 kg", "5 may", "7:43 pm", "no 5"), so a span wetext would read (a piece of a
sentence with its numbers, wetext_spans) is read here only when every word of it is a plain number, a word of
`NEUTRAL` or a name of `NAMES`: words wetext was measured never to join with a number (tests/text/test_plain_numbers.py
compares every one against wetext itself, on each side of an integer, a year, a percentage and a time), and no year,
percentage or time in it is followed by "to" and a percentage (a range: "5% to 7%" -> "five to seven percent").
Anything else is left for wetext. Reading whole spans, never single numbers, keeps what wetext is asked exactly what it
would be asked without this path.
"""
from __future__ import annotations

import re

MAX_DIGITS = 9  # below a billion (wetext says "one hundred and billion")
_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
         "seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ("", " thousand", " million")
_MARK = r"[,.!?]?"
_INTEGER = re.compile(rf"(0|[1-9]\d{{0,{MAX_DIGITS - 1}}})(%?)({_MARK})")
_INTEGER_WORD = re.compile(rf"(?:0|[1-9]\d{{0,{MAX_DIGITS - 1}}}){_MARK}")
_YEAR_WORD = re.compile(rf"[12]\d\d\d{_MARK}")  # read as a year
_TIME = re.compile(rf"(1?\d|2[0-3]):([0-5]\d)({_MARK})")
_NEUTRAL_WORD = re.compile(rf"([A-Za-z]+){_MARK}")
NEUTRAL = frozenset(
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there one all we their been has when who will more if out so said what up its about into "
    "than them can only other new some could time these two then do any my now such like our over man me even "
    "most made after also did many before must through back years where much your way well down should because "
    "each just those people how too little state good very make world still own see men work long get here "
    "between both life being under never day same another know while last might us great old year off come "
    "since against go came right used take three dollars dollar cents cent euros pounds percent times first".split())
NAMES = frozenset(  # capitalised names wetext reads as themselves beside a number (never "May", "March", "Sun")
    "Anna Boris Clara David Elena Frank Grace Henry Iris James John Mary Peter Paul Sarah Tom Emma Lucy Alice Bob "
    "Jack Kate Maria Michael Robert Linda Susan Daniel Thomas Laura Oliver Sophie Chris Smith Brown Jones Wilson "
    "Taylor Lee Chen Wang Zhang Li Liu London Paris Berlin Sydney Tokyo Rome Madrid Moscow Beijing Shanghai Dublin "
    "Vienna Prague Boston Chicago Texas China Japan India France Germany Canada Europe Asia Africa America England "
    "Scotland Wales River Ocean".split())


def read_en_span(text: str) -> str | None:
    """wetext's reading of `text` (words with one space between them) when every word is a plain number, a word of
    NEUTRAL or a name of NAMES and one at least is a number; else None."""
    words, said = text.split(" "), []
    for word in words:
        reading = plain_reading(word)
        if reading is None and not _is_neutral(word):
            return None
        said.append(reading)
    if all(reading is None for reading in said) or _holds_a_range(words, said):
        return None
    return " ".join(word if reading is None else reading for word, reading in zip(words, said, strict=True))


def _holds_a_range(words: list[str], said: list[str | None]) -> bool:
    """A year, percentage or time followed by "to" and a percentage: wetext reads "X to Y%" as a range, and X loses
    its own "percent" or its year or time reading (an integer reads the same)."""
    return any(reading is not None and (not _INTEGER_WORD.fullmatch(word) or _YEAR_WORD.fullmatch(word))
               and words[i + 1: i + 2] in (["to"], ["To"]) and "%" in "".join(words[i + 2: i + 3])
               for i, (word, reading) in enumerate(zip(words, said, strict=True)))


def _is_neutral(word: str) -> bool:
    m = _NEUTRAL_WORD.fullmatch(word)
    if m is None:
        return False
    return m.group(1) in NAMES or (m.group(1).islower() or m.group(1).istitle()) and m.group(1).lower() in NEUTRAL


def plain_reading(word: str) -> str | None:
    """wetext's reading of a plain number, or None when `word` is not one."""
    m = _INTEGER.fullmatch(word)
    if m is not None:
        digits, percent, mark = m.groups()
        if percent:
            return f"{cardinal(int(digits))} percent{mark}"
        return (year(int(digits)) if _YEAR_WORD.fullmatch(digits) else cardinal(int(digits))) + mark
    m = _TIME.fullmatch(word)
    if m is None or (len(m.group(1)) == 2 and m.group(1)[0] == "0"):
        return None
    hour, minutes, mark = int(m.group(1)), int(m.group(2)), m.group(3)
    if minutes == 0:
        return f"{_below_100(hour)} o'clock{mark}"
    return f"{_below_100(hour)} {'o ' if minutes < 10 else ''}{_below_100(minutes)}{mark}"


def cardinal(n: int) -> str:
    """wetext's cardinal: "and" only inside the last group of three ("one hundred and one", "two hundred thirty four
    thousand five hundred and sixty seven") or before it after thousands ("ten thousand and one", "one million one")."""
    if n < 1000:
        return _below_1000(n, "and ")
    groups = []
    while n:
        n, group = divmod(n, 1000)
        groups.append(group)
    words = [_below_1000(group, "") + _SCALES[i] for i, group in reversed(list(enumerate(groups))) if i and group]
    last = groups[0]
    if last:
        words.append(("and " if last < 100 and groups[1] else "") + _below_1000(last, "and "))
    return " ".join(words)


def year(n: int) -> str:
    """wetext's reading of 1000-2999 alone: "nineteen ninety", "ten zero one", "two thousand five", "twenty ten"."""
    high, low = divmod(n, 100)
    if 2000 <= n < 2010:
        return "two thousand" + (f" {_ONES[low]}" if low else "")
    if low == 0:
        return f"{_below_100(high)} hundred"
    return f"{_below_100(high)} {'zero ' if low < 10 else ''}{_below_100(low)}"


def _below_1000(n: int, joiner: str) -> str:
    hundreds, rest = divmod(n, 100)
    if not hundreds:
        return _below_100(rest)
    return f"{_ONES[hundreds]} hundred" + (f" {joiner}{_below_100(rest)}" if rest else "")


def _below_100(n: int) -> str:
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] + (f" {_ONES[ones]}" if ones else "")
