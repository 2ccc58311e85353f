"""Plain English numbers read without wetext (text/plain_numbers.py) give wetext's own words, and the normaliser's
output with them is the output it gives when wetext reads every number."""
from __future__ import annotations

import random

import pytest

from chattts_velocity.text import Normalizer
from chattts_velocity.text import numbers as numbers_module
from chattts_velocity.text.plain_numbers import NAMES, NEUTRAL, plain_reading, read_en_span

pytest.importorskip("wetext")

EDGES = ["0", "1", "2", "9", "10", "11", "12", "13", "19", "20", "21", "99", "100", "101", "110", "119", "999", "1000",
         "1001", "1009", "1010", "1100", "1999", "2000", "2001", "2009", "2010", "2099", "2100", "2999", "3000",
         "3001", "9999", "10000", "10001", "100000", "100001", "1000000", "1000001", "1001000", "1001001",
         "100000000", "999999999", "42,", "42.", "42!", "1990?", "0%", "100%", "1990%", "73%,", "0:30", "7:00",
         "7:05", "12:30", "13:45", "23:59", "7:43."]
NOT_PLAIN = ["007", "00", "-5", "+5", "5.5", "1,000", "1000000000", "07:30", "24:00", "7:60", "5th", "1/2", "$5",
             "42;", "42..", "1990s", "x42", "42x"]
OTHER_WORDS = "Anna Paris May may no No kg pm am km ft x Mon March june o'clock million half point to".split()


@pytest.fixture(scope="module")
def wetext_en():
    from wetext import Normalizer as Wetext

    return Wetext(lang="en", operator="tn").normalize


def numbers(rng: random.Random, count: int) -> list[str]:
    """Integers of every length (some with many zeros), percentages and clock times."""
    out = []
    for _ in range(count):
        length = rng.randint(1, 9)
        digits = str(rng.randint(1, 9)) + "".join(rng.choice("00001234567890") for _ in range(length - 1))
        time = f"{rng.randint(0, 23)}:{rng.randint(0, 59):02d}"
        out.append(rng.choice([digits, digits, f"{digits}%", time]))
    return out


def test_plain_readings_are_wetexts_word_for_word(wetext_en) -> None:
    rng = random.Random(49)
    words = EDGES + [str(n) for n in range(0, 3100, 7)] + numbers(rng, 900)
    wrong = [(word, plain_reading(word), wetext_en(word)) for word in words if plain_reading(word) != wetext_en(word)]
    assert wrong == []


@pytest.mark.parametrize("word", NOT_PLAIN)
def test_other_forms_are_left_for_wetext(word: str) -> None:
    assert plain_reading(word) is None
    assert read_en_span(f"the {word} of the") is None


def test_neutral_words_never_change_a_numbers_reading(wetext_en) -> None:
    rng = random.Random(7)
    pool = EDGES + numbers(rng, 60)
    wrong = []
    for word in sorted(NEUTRAL):
        for shown in (word, word.title()):
            number = rng.choice(pool)
            sentence = f"{shown} {number} {word}"
            if wetext_en(sentence) != f"{shown} {plain_reading(number)} {word}":
                wrong.append((sentence, wetext_en(sentence)))
    assert wrong == []


def test_names_never_change_a_numbers_reading(wetext_en) -> None:
    """Each name on each side of an integer, a year, a percentage and a time (and with a mark after it)."""
    rng = random.Random(11)
    wrong = []
    for name in sorted(NAMES):
        for number in (str(rng.randint(2, 99999)), str(rng.randint(1000, 2999)), f"{rng.randint(0, 100)}%",
                       f"{rng.randint(0, 23)}:{rng.randint(0, 59):02d}"):
            sentence = f"{name} {number} {name}{rng.choice(['', ',', '.', '?', '!'])}"
            if wetext_en(sentence) != f"{name} {plain_reading(number)} {sentence.split()[-1]}":
                wrong.append((sentence, wetext_en(sentence)))
    assert wrong == []
    assert read_en_span("Anna 42 Paris, 7:43 the") == "Anna forty two Paris, seven forty three the"
    assert read_en_span("anna 42 paris") is None  # a name is neutral only capitalised


def test_a_span_with_a_word_that_joins_a_number_is_left_for_wetext() -> None:
    assert read_en_span("the 5 kg of the 42 the") is None and read_en_span("the 42 the") == "the forty two the"
    assert read_en_span("on 5 may") is None and read_en_span("at 7 pm") is None
    assert read_en_span("the  5") is None and read_en_span("the\n5") is None and read_en_span("the of") is None
    # wetext reads "X to Y%" as a range: "158% to 620%" -> "one hundred and fifty eight to six hundred and twenty
    # percent", "2295 to 207%" -> "two thousand two hundred and ninety five to ..."; an integer reads the same
    assert read_en_span("the 158% to 620% of") is None and read_en_span("the 2295 to 7% of") is None
    assert read_en_span("the 7:30 To 7% of") is None
    assert read_en_span("the 5 to 7% of") == "the five to seven percent of"


def test_spans_of_neutral_words_names_and_numbers_are_wetexts(wetext_en) -> None:
    rng = random.Random(4)
    pool = sorted(NEUTRAL) + sorted(NAMES) + ["to"] * 20
    wrong, read = [], 0
    for _ in range(250):
        words = [rng.choice(numbers(rng, 1)) if rng.random() < 0.3 else rng.choice(pool)
                 for _ in range(rng.randint(2, 10))]
        text = " ".join(w + (rng.choice(",.!?") if rng.random() < 0.15 else "") for w in words)
        said = read_en_span(text)
        if said is not None:
            read += 1
            if said != wetext_en(text):
                wrong.append((text, said, wetext_en(text)))
    assert wrong == [] and read > 150


def sentences(rng: random.Random, count: int) -> list[str]:
    """Short sentences (one wetext call in either path) of neutral words, numbers and words that join numbers."""
    pool = sorted(NEUTRAL) + OTHER_WORDS
    odd = ["007", "-5", "5.5", "1,000", "5th", "1/2", "07:30", "1990s", "2024"]  # "$3.50" grows past 64
    out = []
    while len(out) < count:
        words = [rng.choice(numbers(rng, 1) + odd[rng.randrange(len(odd)):][:1]) if rng.random() < 0.35
                 else rng.choice(pool) for _ in range(rng.randint(3, 12))]
        sentence = " ".join(w + (rng.choice(",.!?") if rng.random() < 0.15 else "") for w in words)
        if len(sentence) <= 64:
            out.append(sentence)
    return out


def test_the_normaliser_says_the_same_with_and_without_plain_numbers(monkeypatch) -> None:
    from test_numbers import BROAD  # the sentences of the number tests

    texts = BROAD + sentences(random.Random(2026), 250)
    fast = Normalizer()
    with_plain = [fast(text) for text in texts]
    monkeypatch.setattr(numbers_module, "read_en_span", lambda text: None)
    slow = Normalizer()
    assert [(text, said) for text, said in zip(texts, with_plain, strict=True) if slow(text) != said] == []
