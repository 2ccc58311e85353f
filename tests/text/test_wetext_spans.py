"""What wetext is asked to read: only the parts of a run it would change, with their context; every reading once."""
from __future__ import annotations

import pytest

from chattts_velocity.text.wetext_spans import REACH, WetextMemo, wetext_spans


def test_english_plain_words_are_kept_and_a_number_is_read_with_its_context() -> None:
    text = "the quick brown fox jumps over 3 lazy dogs today "
    spans = wetext_spans(text, "en", lambda word: True)
    assert "".join(piece for piece, _ in spans) == text
    assert [piece for piece, hot in spans if hot] == [" jumps over 3 lazy dogs"] and REACH == 2
    assert all(not hot for _, hot in wetext_spans("lowercase words only, and more of them.", "en", lambda w: False))


def test_a_capitalised_word_is_read_only_when_wetext_changes_it() -> None:
    changes = {"Mon", "Mr"}
    spans = wetext_spans("see you on Mon with Anna and the others", "en", lambda word: word not in changes)
    assert [piece for piece, hot in spans if hot] == [" you on Mon with Anna"]  # "Anna" is context of "Mon"


def test_chinese_is_kept_and_a_number_is_read_with_three_characters_each_side() -> None:
    text = "我们今天去公园散步，天气很好价格是25元我们回家。"
    spans = wetext_spans(text, "zh", lambda word: True)
    assert "".join(piece for piece, _ in spans) == text
    assert [piece for piece, hot in spans if hot] == ["价格是25元我们"]


def test_the_memo_reads_each_text_once_and_remembers_failures() -> None:
    calls: list[str] = []

    def read(text: str) -> str:
        calls.append(text)
        if text == "bad":
            raise AssertionError("wetext asserts on some inputs")
        return text.upper()

    memo = WetextMemo(read, size=2)
    assert [memo("a"), memo("a"), memo("bad"), memo("bad")] == ["A", "A", None, None] and calls == ["a", "bad"]
    memo("c")  # the oldest ("a") goes
    assert memo("a") == "A" and calls == ["a", "bad", "c", "a"]


@pytest.fixture(scope="module")
def normalizer():
    pytest.importorskip("wetext")
    from chattts_velocity.text import Normalizer

    return Normalizer()


def test_a_run_of_digits_too_long_to_name_is_read_digit_by_digit(normalizer) -> None:
    assert normalizer("code " + "1203" * 10 + " ok") == "code " + " ".join(["one two zero three"] * 10) + " ok"
    assert normalizer("编号" + "1203" * 10) == "编号" + "幺二零三" * 10
