"""Chinese plain numbers read without wetext (text/zh_numbers.py) give wetext's own words: every form and every
neutral character is read through wetext itself here, on the same string, and the two must be equal."""
from __future__ import annotations

import random

import pytest

from chattts_velocity.text.zh_numbers import (
    MARKS,
    MAX_DIGITS,
    MEASURES,
    NEUTRAL,
    SPAN_AFTER_YEAR,
    SPECIAL,
    read_zh_span,
)

pytest.importorskip("wetext")

EDGES = [0, 1, 2, 3, 9, 10, 11, 12, 19, 20, 21, 22, 99, 100, 101, 102, 110, 112, 120, 200, 202, 220, 222, 999, 1000,
         1001, 1002, 1010, 1020, 1100, 1200, 2000, 2002, 2020, 2200, 2222, 9999, 10000, 10001, 10010, 10100, 11000,
         12000, 20000, 20002, 22222, 100000, 100010, 110000, 120000, 200000, 1000000, 1000001, 1000100, 2000000,
         10000000, 10000001, 12345678, 20000000, 22222222, 99999999]
MINUTES = [f"{m:02d}" for m in range(1, 10)] + [str(m) for m in range(1, 60)]
NOT_READ_HERE = ["约2元", "有2元3月的", "有00元", "有007元", "有-2元", "有123456789元", "有25元,", "有2 元", "有25％",
                 "有12345，", "有25，3月的", "有25的人", "有25。3元", "3点30", "在3:30", "0:30", "1:5", "12:45:30",
                 "25点", "有13月", "有3月32日", "有0月", "二零2024年", "有12年", "有25次", "有2公斤", "有25元A",
                 "Q2有25元", "有2.元", "有.5元", "有1.2.3元", "在2024年前", "9400年内", "2024年来"]


@pytest.fixture(scope="module")
def wetext_zh():
    from wetext import Normalizer as Wetext

    return Wetext(lang="zh", operator="tn").normalize


def integers(rng: random.Random, count: int) -> list[int]:
    """Integers of every length up to MAX_DIGITS, many with runs of zeros and twos (零 and 两 are where slips hide)."""
    out = []
    for _ in range(count):
        length = rng.randint(1, MAX_DIGITS)
        out.append(int(str(rng.randint(1, 9)) + "".join(rng.choice("0000122345679") for _ in range(length - 1))))
    return out


def forms(rng: random.Random) -> list[str]:
    """One of each form with fresh numbers: count, percentage, year, year-month, year-month-day, month, month-day,
    hour, hour-minute, count with a fraction, percentage with a fraction."""
    year, month, day, hour = rng.randint(1000, 9999), rng.randint(1, 12), rng.randint(1, 31), rng.randint(0, 24)
    count, percent = rng.choice(integers(rng, 1) + EDGES), rng.choice(integers(rng, 1) + EDGES[:30])
    day_mark, fraction = rng.choice("日号"), "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 4)))
    return [f"{count}{rng.choice(MEASURES)}", f"{percent}%", f"{year}年", f"{year}年{month}月",
            f"{year}年{month}月{day}{day_mark}", f"{month}月", f"{month}月{day}{day_mark}", f"{hour}点",
            f"{hour}点{rng.choice(MINUTES)}分",
            f"{rng.choice([0, 2, count])}.{fraction}{rng.choice(MEASURES)}",
            f"{rng.choice([0, 2, percent])}.{fraction}%"]


def test_counts_and_percentages_are_wetexts(wetext_zh) -> None:
    numbers = EDGES + integers(random.Random(5), 250)
    texts = [f"有{n}元" for n in numbers] + [f"是{n}%，" for n in numbers[::2]]
    texts += [f"有{n}{unit}的" for unit in MEASURES for n in (2, 12, 20, 110, 200, 2024, 20000, 22222)]
    assert [(t, read_zh_span(t), wetext_zh(t)) for t in texts if read_zh_span(t) != wetext_zh(t)] == []


def test_dates_are_wetexts(wetext_zh) -> None:
    rng = random.Random(8)
    years = [1000, 1990, 2000, 2001, 2010, 2024, 2030, 9999] + [rng.randint(1000, 9999) for _ in range(30)]
    texts = [f"在{year}年{month}月" for year, month in zip(years, range(1, 13), strict=False)]
    days = [(day, mark) for day in (1, 2, 10, 12, 20, 22, 31) for mark in "日号"]
    texts += [f"是{month}月{day}{mark}的" for month in range(1, 13) for day, mark in days]
    texts += [f"在{year}年" for year in years]
    texts += [f"于{rng.choice(years)}年{rng.randint(1, 12)}月{day}日" for day in range(1, 32)]
    assert [(t, read_zh_span(t), wetext_zh(t)) for t in texts if read_zh_span(t) != wetext_zh(t)] == []


def test_numbers_alone_are_wetexts(wetext_zh) -> None:
    """Up to four digits before a mark or at the end: SPECIAL digit by digit, the rest as with a fraction (every
    number of 0-9999 was measured once; this reads 0-300, SPECIAL and a sample)."""
    rng = random.Random(14)
    numbers = sorted({*range(301), *map(int, SPECIAL), *rng.sample(range(301, 10_000), 150)})
    texts = [f"有{n}{rng.choice(sorted(MARKS))}" for n in numbers] + [f"第{n}" for n in numbers[::3]]
    assert [(t, read_zh_span(t), wetext_zh(t)) for t in texts if read_zh_span(t) != wetext_zh(t)] == []


@pytest.mark.slow
def test_every_number_alone_below_ten_thousand_is_wetexts(wetext_zh) -> None:
    texts = [f"有{n}，" for n in range(10_000)]
    assert [(t, read_zh_span(t), wetext_zh(t)) for t in texts if read_zh_span(t) != wetext_zh(t)] == []


def test_times_are_wetexts(wetext_zh) -> None:
    rng = random.Random(12)
    texts = [f"在{hour}点的" for hour in range(25)]
    texts += [f"{hour}点{minute}分" for hour in range(25) for minute in rng.sample(MINUTES, 6)]
    assert [(t, read_zh_span(t), wetext_zh(t)) for t in texts if read_zh_span(t) != wetext_zh(t)] == []


def test_fractions_are_wetexts(wetext_zh) -> None:
    rng = random.Random(13)
    numbers = [0, 1, 2, 10, 12, 20, 22, 200, 2000, 20000] + integers(rng, 40)
    texts = [f"有{n}.{rng.choice(['0', '5', '05', '25', '50', '2', '123456'])}{rng.choice(MEASURES + ('%',))}"
             for n in numbers for _ in range(3)]
    assert [(t, read_zh_span(t), wetext_zh(t)) for t in texts if read_zh_span(t) != wetext_zh(t)] == []


@pytest.mark.slow
def test_every_neutral_character_and_mark_on_each_side_of_every_form(wetext_zh) -> None:
    """Each character between all the forms; one of SPAN_AFTER_YEAR after a year leaves the span to wetext."""
    rng = random.Random(49)
    wrong, declined = [], set()
    for c in sorted(NEUTRAL | MARKS):
        shown = forms(rng)
        for text in (c.join(["", *shown[:4], ""]), c.join(["", *shown[4:7], ""]), c.join(["", *shown[7:], ""])):
            said = read_zh_span(text)
            if said is None:
                declined.add(c)
            elif said != wetext_zh(text):
                wrong.append((text, said, wetext_zh(text)))
    assert wrong == [] and declined == set(SPAN_AFTER_YEAR)


def test_every_neutral_character_and_mark_between_forms(wetext_zh) -> None:
    """The default suite's share of the test above: each character between two random forms, twice, six characters
    a span (a fifth of its wetext work)."""
    rng = random.Random(50)
    wrong = []
    for _ in range(2):
        characters = sorted(NEUTRAL | MARKS)
        rng.shuffle(characters)
        for start in range(0, len(characters), 6):
            pieces = [rng.choice(forms(rng))]
            for c in characters[start:start + 6]:
                if c in SPAN_AFTER_YEAR and pieces[-1].endswith("年"):
                    pieces[-1] = forms(rng)[0]  # a count: "2024年前" is a span of years (the test above)
                pieces += [c, rng.choice(forms(rng))]
            text = "".join(pieces)
            if read_zh_span(text) != wetext_zh(text):
                wrong.append((text, read_zh_span(text), wetext_zh(text)))
    assert wrong == []


def test_every_neutral_character_and_mark_before_a_number_alone(wetext_zh) -> None:
    rng = random.Random(51)
    characters, marks, wrong = sorted(NEUTRAL | MARKS), sorted(MARKS), []
    for start in range(0, len(characters), 6):
        text = "".join(f"{c}{rng.choice(EDGES[:26] + sorted(SPECIAL))}{rng.choice(marks)}"
                       for c in characters[start:start + 6])
        if read_zh_span(text) != wetext_zh(text):
            wrong.append((text, read_zh_span(text), wetext_zh(text)))
    assert wrong == []


def test_spans_of_neutral_characters_marks_and_forms_are_wetexts(wetext_zh) -> None:
    """Random spans as wetext_spans cuts them (up to ten characters of context around a form, clauses joined)."""
    rng = random.Random(2026)
    pool = sorted(NEUTRAL) * 4 + sorted(MARKS)
    wrong, read = [], 0
    for _ in range(300):
        pieces = ["".join(rng.choice(pool) for _ in range(rng.randint(0, 4)))]
        for _ in range(rng.randint(1, 3)):
            alone = f"{rng.choice(EDGES[:30])}{rng.choice(sorted(MARKS))}"  # a number alone needs a mark after it
            pieces += [rng.choice([*forms(rng), alone]), "".join(rng.choice(pool) for _ in range(rng.randint(1, 4)))]
        text = "".join(pieces)[: 64]
        if read_zh_span(text) is not None:
            read += 1
            if read_zh_span(text) != wetext_zh(text):
                wrong.append((text, read_zh_span(text), wetext_zh(text)))
    assert wrong == [] and read > 250


@pytest.mark.parametrize("text", NOT_READ_HERE)
def test_anything_else_is_left_for_wetext(text: str) -> None:
    assert read_zh_span(text) is None
