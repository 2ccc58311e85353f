"""Text stage: the rewrites around wetext that make numbers and symbols read well (zh and en).

In: one language run of a sentence. `before_wetext` puts what wetext reads badly or not at all
(e-mails, international phone numbers, "$3.50", "¥350万", "第2名", "1990s", "#1", "~5") into forms
it reads well; `after_wetext` fixes its known slips ("ten hundred", "thousand" without "one",
"AM") and turns the symbols left over into words, and spells any digit that survived.
`Say` is wetext's reading of a short piece in the run's language.
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

Say = Callable[[str], str]

DIGITS = {"zh": "零一二三四五六七八九", "en": "zero one two three four five six seven eight nine".split()}
_PHONE_DIGITS_ZH = str.maketrans("0123456789", "零幺二三四五六七八九")  # in phone numbers "1" is read 幺
SYMBOLS = {
    "zh": {"&": "和", "@": "艾特", "+": "加", "=": "等于", "%": "百分号", "°": "度", "/": "斜杠", "#": "井号",
           "²": "平方", "³": "立方", "¢": "分", "$": "美元", "€": "欧元", "£": "英镑", "¥": "元", "￥": "元",
           "×": "乘", "÷": "除以", "‰": "千分号", ">": "大于", "<": "小于", "≥": "大于等于",
           "≤": "小于等于", "≠": "不等于", "≈": "约等于", "±": "正负", "√": "根号", "∞": "无穷大"},
    "en": {"&": "and", "@": "at", "+": "plus", "=": "equals", "%": "percent", "°": "degrees", "/": "slash",
           "#": "hash", "²": "squared", "³": "cubed", "¢": "cents", "$": "dollars", "€": "euros",
           "£": "pounds", "¥": "yen", "￥": "yuan", "×": "times", "÷": "divided by", "‰": "per mille",
           ">": "greater than", "<": "less than", "≥": "greater than or equal to",
           "≤": "less than or equal to", "≠": "not equal to", "≈": "approximately", "±": "plus or minus",
           "√": "square root of", "∞": "infinity"},
}
CURRENCY_ZH = {"$": "美元", "€": "欧元", "£": "英镑", "¥": "元", "￥": "元"}
CURRENCY_EN = {"$": ("dollar", "cent"), "€": ("euro", "cent"), "£": ("pound", "penny")}
_EN_NUMBER_WORDS = set(DIGITS["en"]) | set("ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen "
                                            "nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred "
                                            "and".split())

_WIDE = re.compile(r"[０-９Ａ-Ｚａ-ｚ％＋＝＠＆＃＄\u2460-\u2473\u3380-\u33df]")  # full-width, ①-⑳, ㎡ ㎞ ...
_SQUARED = {"㎡": "m²", "㎥": "m³", "㎢": "km²", "㎠": "cm²"}  # NFKC would give "m2"
_EMAIL = re.compile(r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
_CODE = re.compile(r"(?<=[A-Za-z])\d{5,}")  # "SF1234567890": a code, read digit by digit
_MAH = re.compile(r"(?<=\d) ?mAh(?![A-Za-z])")
_PHONE = re.compile(r"(?<![A-Za-z0-9+])\+(\d{1,3}(?:[ -]\d{1,5}){2,5})(?![\d-])")
_AMOUNT_THEN_SIGN = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?) ?([$€£])(?!\w)")
_WORD_HYPHEN = re.compile(r"(?<=[A-Za-z])-(?=[A-Za-z0-9])|(?<=\d)-(?=[A-Za-z])")
_RANGE_TILDE = re.compile(r"(?<=\d) ?[~～] ?(?=\d)")
_ABOUT_TILDE = re.compile(r"(?<!\d)约?[~～] ?(?=\d)")
_FEET_INCHES = re.compile(r"(?<!\d)(\d+)'(\d+)\"")
_PER_MILLE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?) ?‰")
_NUMBER_SIGN = re.compile(r"(?:#|\b[Nn]o\. ?)(\d+)")
_SCALE = r" ?(?:[KkMmBb]n?\b|thousand|million|billion|trillion)"
_CENTS = re.compile(rf"([$€£])(\d+)\.(\d\d)(?!\d)(?!{_SCALE})")  # "$3.50", not "$3.50 million"
_SCALED_CURRENCY = re.compile(r"([¥￥$€£])(\d+(?:\.\d+)?)([万亿])")
_GROUPED = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])")
_DECADE = re.compile(r"'(\d0)s\b|\b(1\d\d0|20\d0)s\b")  # '80s, 1990s (wetext reads "the 90s" itself)
_LEADING_PLUS = re.compile(r"(?<![A-Za-z0-9)])\+(?=\d)")
_THOUSAND = re.compile(r"(\b\w+ +)?\bthousand\b")
_MERIDIEM = re.compile(r"\b([AP])M\b")
_DIGIT = re.compile(r"\d")
MAX_CARDINAL_DIGITS = 36  # "undecillion" is the last name of a number: a longer run of digits is read digit by digit
_NO_READING = re.compile(rf"(?<!\d)\d{{{MAX_CARDINAL_DIGITS + 1},}}")
# NOTE: a pattern that starts with a repeated class has a lookbehind excluding that class: otherwise every position
# of a long run (4096 digits, say) starts a match attempt that scans to the run's end, and the search is quadratic.


def before_wetext(text: str, lang: str, say: Say) -> str:
    text = _WIDE.sub(lambda m: _SQUARED.get(m.group(0)) or unicodedata.normalize("NFKC", m.group(0)), text)
    text = _NO_READING.sub(lambda m: f" {_digit_by_digit(m.group(0), lang)} " if lang == "en"
                           else _digit_by_digit(m.group(0), lang), text)
    text = _EMAIL.sub(lambda m: _spoken_email(m.group(0), lang), text)
    text = _PHONE.sub(lambda m: _spoken_phone(m.group(1), lang), text)
    text = _CODE.sub(lambda m: ("" if lang == "zh" else " ") + _digit_by_digit(m.group(0), lang), text)
    text = _MAH.sub("毫安时" if lang == "zh" else " milliamp hours", text)
    text = _AMOUNT_THEN_SIGN.sub(r"\2\1", text)
    text = _WORD_HYPHEN.sub(" ", text)
    text = _PER_MILLE.sub(r"千分之\1" if lang == "zh" else r"\1 per mille", text)
    text = _NUMBER_SIGN.sub(r"\1号" if lang == "zh" else r"number \1", text)
    return _before_zh(text) if lang == "zh" else _before_en(text, say)


def _before_zh(text: str) -> str:
    text = _FEET_INCHES.sub(r"\1英尺\2英寸", _RANGE_TILDE.sub("~", text))
    text = _ABOUT_TILDE.sub("约", text)
    text = text.replace("÷", "除以")
    text = _SCALED_CURRENCY.sub(lambda m: m.group(2) + m.group(3) + CURRENCY_ZH[m.group(1)], text)
    return _GROUPED.sub(lambda m: m.group(0).replace(",", ""), text)


def _before_en(text: str, say: Say) -> str:
    text = _FEET_INCHES.sub(r"\1 feet \2 inches", _RANGE_TILDE.sub(" to ", text))
    text = _ABOUT_TILDE.sub("about ", text)
    text = text.replace("×", " times ").replace("÷", " divided by ").replace("=", " equals ")
    text = text.replace("24/7", "24 7")
    text = _LEADING_PLUS.sub("plus ", text)
    text = _CENTS.sub(_dollars_and_cents, text)
    return _DECADE.sub(lambda m: _plural(say(m.group(1) or m.group(2))), text)


def after_wetext(text: str, lang: str, source: str) -> str:
    """`source` is the run before wetext: a "thousand" it did not hold came from digits."""
    if lang == "zh":
        text = text.replace("第两", "第二")  # wetext: 第2名 -> 第两名
    else:
        text = text.replace("ten hundred", "one thousand")
        if "thousand" not in source.lower():
            text = _THOUSAND.sub(_one_thousand, text)
        text = _MERIDIEM.sub(lambda m: m.group(1).lower() + " m", text)
    text = _spoken_symbols(text, lang)
    return spell_digits(text, lang)


def spell_digits(text: str, lang: str) -> str:
    """Digits one by one: the last resort, so that no digit reaches the model."""
    if lang == "zh":
        return _DIGIT.sub(lambda m: DIGITS["zh"][int(m.group(0))], text)
    return _tidy_spaces(_DIGIT.sub(lambda m: f" {DIGITS['en'][int(m.group(0))]} ", text), text)


def _spoken_symbols(text: str, lang: str) -> str:
    table = SYMBOLS[lang]
    if not any(c in table for c in text):
        return text
    if lang == "zh":
        return "".join(table.get(c, c) for c in text)
    return _tidy_spaces("".join(f" {table[c]} " if c in table else c for c in text), text)


def _tidy_spaces(spoken: str, source: str) -> str:
    """One space between words, none before a mark, and the source's own edge spaces."""
    spoken = re.sub(r" (?=[,.!?;:，。])", "", re.sub(r" {2,}", " ", spoken)).strip(" ")
    lead = " " if source[:1] == " " else ""
    return lead + spoken + (" " if source[-1:] == " " else "")


def _spoken_email(address: str, lang: str) -> str:
    """"info@example.com" -> "info at example dot com" / "info艾特example点com"; digits one by one."""
    local, domain = (_digit_by_digit(part, lang) for part in address.split("@", 1))
    if lang == "zh":
        return f"{local}艾特{domain.replace('.', '点')}"
    return f"{local} at {domain.replace('.', ' dot ')}"


def _digit_by_digit(text: str, lang: str) -> str:
    return spell_digits(text, lang) if lang == "en" else text.translate(_PHONE_DIGITS_ZH)


def _spoken_phone(number: str, lang: str) -> str:
    """"+86 138 1234 5678" -> plus, then each group digit by digit, a pause between groups."""
    groups = [_digit_by_digit(g, lang) for g in re.split(r"[ -]", number)]
    if lang == "zh":
        return "加" + " ".join(groups)
    return "plus " + ", ".join(groups)


def _dollars_and_cents(m: re.Match[str]) -> str:
    """"$3.50" -> "3 dollars 50 cents" (wetext reads it "three point five dollars")."""
    unit, subunit = CURRENCY_EN[m.group(1)]
    whole, cents = int(m.group(2)), int(m.group(3))
    parts = [] if whole == 0 and cents else [f"{whole} {unit if whole == 1 else _plural(unit)}"]
    if cents:
        parts.append(f"{cents} {subunit if cents == 1 else _plural(subunit)}")
    return " ".join(parts)


def _plural(words: str) -> str:
    """English plural of the last word: ninety -> nineties, penny -> pence, dollar -> dollars."""
    if words.endswith("penny"):
        return words[:-5] + "pence"
    if words.endswith("y"):
        return words[:-1] + "ies"
    return words + "s"


def _one_thousand(m: re.Match[str]) -> str:
    """wetext says "thousand two hundred" for 1,200 in money and grouped numbers."""
    before = m.group(1) or ""
    if before.strip().lower() in _EN_NUMBER_WORDS:
        return m.group(0)
    return f"{before}one thousand"
