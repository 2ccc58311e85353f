"""Text normaliser (upstream's rules and homophone map) and sentence splitting (as upstream splits a text)."""
from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest

from chattts_velocity.text import Normalizer, detect_language, split_text
from chattts_velocity.text.normalizer import HOMOPHONES_PATH, combine_tags, split_tags


def read_pairs() -> list[tuple[str, str]]:
    lines = Path(HOMOPHONES_PATH).read_text(encoding="utf-8").splitlines()
    return [tuple(line.split("\t")) for line in lines if line and not line.startswith("#")]


@pytest.fixture()
def norm() -> Normalizer:
    return Normalizer(load_defaults=False)


def test_homophone_table_size_and_range() -> None:
    pairs = read_pairs()
    assert len(pairs) == 16425 == len({s for s, _ in pairs})
    assert all("\u4e00" <= s <= "\u9fa5" and "\u4e00" <= t <= "\u9fa5" for s, t in pairs)


def test_zh_half_width_becomes_full_width(norm: Normalizer) -> None:
    assert norm("你好,世界.", lang="zh", do_homophone_replacement=False) == "你好，世界。"
    # tags keep "[", "]" and "_" under the zh map
    assert norm("你[uv_break]好", lang="zh", do_homophone_replacement=False) == "你[uv_break]好"


def test_simplifier_depends_on_language(norm: Normalizer) -> None:
    # zh: "!" -> "！" -> "。"; en: "!" -> "."; brackets and colons become commas
    assert norm("你好!", lang="zh", do_homophone_replacement=False) == "你好。"
    assert norm("你好!", lang="en", do_homophone_replacement=False) == "你好."
    # Deviation: upstream keeps the ",," the mapping makes; runs collapse into the strongest mark.
    assert norm("甲(乙):丙", lang="zh", do_homophone_replacement=False) == "甲，乙，丙"
    assert norm("甲(乙):丙", lang="en", do_homophone_replacement=False) == "甲,乙,丙"


def test_without_a_normaliser_digits_are_dropped_and_named(norm: Normalizer, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        assert norm("你好123", do_homophone_replacement=False) == "你好"
    assert "dropped characters the model cannot read: 1 2 3" in caplog.text
    # Deviation: upstream deletes "?"; it ends the sentence instead.
    assert norm("为什么?", do_homophone_replacement=False) == "为什么。"
    assert norm("hello, world! 123") == "hello, world. "


def test_registered_normaliser_spells_digits_first(norm: Normalizer) -> None:
    assert norm.register("zh", lambda t: t.replace("1", "一"))
    assert norm("第1名", lang="zh", do_homophone_replacement=False) == "第一名"


def test_homophone_replacement_single_pass(norm: Normalizer) -> None:
    pairs = read_pairs()
    source, target = pairs[0]
    assert norm(source * 2, do_text_normalization=False) == target * 2
    assert norm(source, do_text_normalization=False, do_homophone_replacement=False) == source
    mapping = dict(pairs)
    first, second = next((s, t) for s, t in pairs if t in mapping and mapping[t] != t)
    assert norm(first, do_text_normalization=False) == second  # no chaining to mapping[second]


def test_tag_splitting() -> None:
    assert split_tags("a[b]c[d") == (["a", "c"], ["[b]"])
    assert split_tags("[x][y]") == (["", ""], ["[x]", "[y]"])
    assert split_tags("x[a[b]y") == (["x", "", "y"], ["[b]"])
    for text in ["你好[uv_break]世界[laugh]", "[laugh]开始了[oral_2]", "无标签"]:
        assert combine_tags(*split_tags(text)) == text


def test_normaliser_sees_only_plain_segments(norm: Normalizer) -> None:
    assert norm.register("en", str.upper)
    assert norm("ab[uv_break]cd", lang="en") == "AB[uv_break]CD"
    assert norm("ab[uv_br", lang="en") == "AB"  # unterminated tail dropped


def test_unterminated_tag_dropped_when_invalid(norm: Normalizer) -> None:
    assert norm("你好[uv_br", do_homophone_replacement=False) == "你好"
    assert norm("你好[uv_break]世界[laugh]", do_homophone_replacement=False) == "你好[uv_break]世界[laugh]"


def test_stray_closing_bracket_keeps_tag_order(norm: Normalizer) -> None:
    # Deviation: upstream gives "abc[uv_break]" here (its splitter records an empty tag at "]").
    # The stray "]" is plain text, so it becomes a pause like any bracket.
    assert norm("a]b[uv_break]c") == "a,b[uv_break]c"


def test_empty_text_gives_empty_even_with_a_normaliser(norm: Normalizer) -> None:
    assert norm("") == ""
    assert norm.register("zh", lambda t: t)
    assert norm("", lang="zh") == ""


def test_register_validation(norm: Normalizer) -> None:
    def boom(text: str) -> str:
        raise RuntimeError("broken")

    assert norm.register("en", str.lower)
    assert not norm.register("en", str.upper)  # duplicate name keeps the first
    assert norm.normalizers["en"] is str.lower
    assert not norm.register("zh", lambda t: 42)
    assert not norm.register("zh", boom)
    assert "zh" not in norm.normalizers
    norm.unregister("en")
    norm.unregister("never-registered")
    assert norm.register("en", str.upper)


def test_default_normalizers_never_fail() -> None:
    norm = Normalizer(load_defaults=False)
    wetext = importlib.util.find_spec("wetext")
    available = {"zh": wetext or importlib.util.find_spec("tn"),
                 "en": wetext or importlib.util.find_spec("nemo_text_processing")}
    added = norm.register_default_normalizers()
    assert set(added) == {name for name, spec in available.items() if spec is not None}
    assert set(added) == set(norm.normalizers)
    assert norm.register_default_normalizers() == []  # registered ones are kept


def test_language_detection() -> None:
    assert detect_language("你好 hello") == "zh"
    assert detect_language("你 hello") == "en"  # ties go to en
    assert detect_language("") == "en"


def test_non_string_input_raises(norm: Normalizer) -> None:
    with pytest.raises(ValueError, match="text"):
        norm(["你好"])
    with pytest.raises(ValueError, match="text"):
        split_text(None)


def test_split_text() -> None:
    assert split_text("第一句。第二句. Third. four") == ["第一句。", "第二句. ", "Third. ", "four"]
    assert split_text("a.b") == ["a.b"]
    # Deviation: empty / whitespace-only lines are dropped (upstream keeps empty lines).
    assert split_text("一行。\n\n  \n二行. 还是二行") == ["一行。", "二行. 还是二行"]
    assert split_text("。 ") == ["。"]
    assert split_text("") == []
