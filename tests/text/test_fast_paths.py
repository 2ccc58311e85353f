"""The normaliser's fast paths (plain_numbers for English, zh_numbers for Chinese) change what it costs, never what it
says: the output equals the output with every number read by wetext, on a seeded corpus of the benchmark's kinds and
the number tests' sentences; and number-dense text costs a few times what prose of the same length costs and a fraction
of what it costs with wetext reading every number, both measured in the same run."""
from __future__ import annotations

import random
import time

import pytest

from benchmarks.bench_normalizer import HAN, chinese, english
from chattts_velocity.text import Normalizer
from chattts_velocity.text import numbers as numbers_module
from chattts_velocity.text.numbers import SpokenText

pytest.importorskip("wetext")

NO_NUMBERS = 10**12  # a number in one clause or word out of this many: prose without numbers
DENSE_OVER_PROSE = 5.0  # number-dense text costs at most this many times prose of its length (measured: 1.5x
# Chinese, 3x English, where wetext still reads the spans beside "may" and "no"; wetext reading every number: 40x, 5-6x)
FAST_OVER_WETEXT = 1 / 3  # ... and at most this share of its cost with wetext reading every number (measured 3%, 12%)


def corpus(seed: int, chars: int) -> list[str]:
    """The benchmark's prose and number-dense kinds, English and Chinese, and Chinese with every form, from `seed`."""
    rng = random.Random(seed)
    return [english(rng, chars, 40), english(rng, chars, 4), chinese(rng, chars, 6), chinese(rng, chars, 1),
            chinese_forms(rng, chars)]


def chinese_forms(rng: random.Random, chars: int) -> str:
    """Chinese clauses, each with a number in one of zh_numbers' forms or one it leaves to wetext."""
    from test_zh_numbers import NOT_READ_HERE, forms

    out: list[str] = []
    while sum(map(len, out)) < chars:
        number = rng.choice([*forms(rng), str(rng.randint(0, 9999)), rng.choice(NOT_READ_HERE)])
        out.append("".join(rng.choice(HAN) for _ in range(rng.randint(1, 8))) + number + rng.choice("，，。！的了"))
    return "".join(out)[:chars]


def sentences() -> list[str]:
    from test_numbers import BROAD  # the sentences of the number tests

    return BROAD


def without_fast_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(numbers_module, "read_en_span", lambda text: None)
    monkeypatch.setattr(numbers_module, "read_zh_span", lambda text: None)


def differences(texts: list[str], monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    """(text, output, output with wetext reading every number) wherever the two differ."""
    fast = Normalizer()
    said = [fast(text) for text in texts]
    without_fast_paths(monkeypatch)
    slow = Normalizer()
    return [(text, out, slow(text)) for text, out in zip(texts, said, strict=True) if slow(text) != out]


def test_the_fast_paths_say_what_wetext_says(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = corpus(7, 1024) + sentences()
    assert differences(texts, monkeypatch) == []


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_the_fast_paths_say_what_wetext_says_on_a_large_corpus(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    texts = corpus(1000 + seed, 4096)
    assert differences(texts, monkeypatch) == []


def cpu_cost(normalizer: Normalizer, text: str) -> float:
    """The least CPU time of three readings of `text`, each with wetext's memo emptied (every reading is paid for)."""
    def once() -> float:
        for fn in normalizer.normalizers.values():
            if isinstance(fn, SpokenText):
                fn.forget()
        started = time.process_time()
        normalizer(text, dropped=set())
        return time.process_time() - started
    return min(once() for _ in range(3))


@pytest.mark.parametrize("make", [english, chinese])
def test_number_dense_text_costs_about_what_prose_costs(make, monkeypatch: pytest.MonkeyPatch) -> None:
    """A number every four words (English) or in every clause (Chinese) costs at most DENSE_OVER_PROSE times the same
    length of prose without numbers, and at most FAST_OVER_WETEXT of its cost with wetext reading every number."""
    normalizer = Normalizer()
    rng = random.Random(31)
    prose, dense = make(rng, 2048, NO_NUMBERS), make(rng, 2048, 4 if make is english else 1)
    cpu_cost(normalizer, prose[:200])  # first-call costs
    prose_cost, dense_cost = cpu_cost(normalizer, prose), cpu_cost(normalizer, dense)
    without_fast_paths(monkeypatch)
    wetext_cost = cpu_cost(normalizer, dense)
    assert dense_cost <= DENSE_OVER_PROSE * prose_cost, (dense_cost, prose_cost)
    assert dense_cost <= FAST_OVER_WETEXT * wetext_cost, (dense_cost, wetext_cost)
