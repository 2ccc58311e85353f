"""Numbers, money, dates, times, units and symbols read aloud (text/numbers.py, text/spoken_rules.py)."""
from __future__ import annotations

import logging
import re
import sys

import pytest

from chattts_velocity.text import Normalizer, Tokenizer
from chattts_velocity.text import normalizer as normalizer_module
from chattts_velocity.text.numbers import SpokenText, language_runs

pytest.importorskip("wetext")

UNK = 100  # [UNK] in the ChatTTS tokenizer

ZH = [
    ("价格是25元，时间是2024年3月5日", "价格是二十五元，时间是二零二四年三月五日"),
    ("今天气温-3°C到12℃，湿度85%。", "今天气温负三摄氏度到十二摄氏度，湿度百分之八十五。"),
    ("会议在下午3:30开始，请提前10分钟到。", "会议在下午三点三十分开始，请提前十分钟到。"),
    ("他跑了3.5km，体重下降了2kg。", "他跑了三点五公里，体重下降了两千克。"),
    ("请拨打13812345678或者010-62345678联系我们。", "请拨打幺三八幺二三四五六七八或者零一零六二三四五六七八联系我们。"),
    ("国际电话+86 138 1234 5678。", "国际电话加八六 幺三八 幺二三四 五六七八。"),
    ("这套房子120m²，总价¥350万。", "这套房子一百二十平方米，总价三百五十万元。"),
    ("第1名获得了1000美元奖金，第2名500元。", "第一名获得了一千美元奖金，第二名五百元。"),
    ("比分是3:2，主队获胜。", "比分是三比二，主队获胜。"),
    ("2023年的GDP增长了5.2%。", "二零二三年的GDP增长了百分之五点二。"),
    ("一共有1,234,567人参加。", "一共有一百二十三万四千五百六十七人参加。"),
    ("1/3的人同意，温度是-0.5℃。", "三分之一的人同意，温度是负零点五摄氏度。"),
    ("A&B公司的邮箱是info@example.com。", "A和B公司的邮箱是info艾特example点com。"),
    ("1+1=2，这很简单。", "一加一等于二，这很简单。"),
    ("营业时间9:00~18:00，是/否", "营业时间九点到十八点，是斜杠否"),
    ("这个苹果重0.25kg，售价$3.50。", "这个苹果重零点二五千克，售价三点五零美元。"),
    ("价格上涨了€20，约合£17。", "价格上涨了二十欧元，约合十七英镑。"),
    ("现在是2024-03-05 10:30。", "现在是二零二四年三月五日 十点三十分。"),
    ("他说：“我今年18岁了！”", "他说，我今年十八岁了。"),
    ("①首先，面积50㎡，１２３元", "一首先，面积五十平方米，一百二十三元"),
    ("快递单号：SF1234567890，电池5000mAh。", "快递单号，SF幺二三四五六七八九零，电池五千毫安时。"),
]

EN = [
    ("$3.50 at 10:30am", "three dollars fifty cents at ten thirty a m"),
    ("The price is $25.99, not $30.", "The price is twenty five dollars ninety nine cents, not thirty dollars."),
    ("It was -5°C on January 3rd, 2024.",
     "It was negative five degrees Celsius on the third of january, twenty twenty four."),
    ("She finished 1st and he finished 22nd.", "She finished first and he finished twenty second."),
    ("Call me at 555-123-4567.", "Call me at five five five, one two three, four five six seven."),
    ("Email me at john@example.com or call +1 800 555 0199.",
     "Email me at john at example dot com or call plus one, eight zero zero, five five five, zero one nine nine."),
    ("The room is 25m² and costs €1,200 a month.",
     "The room is twenty five square meters and costs one thousand two hundred euros a month."),
    ("About 45% of people agree.", "About forty five percent of people agree."),
    ("The meeting is at 3:30 pm on 2024-03-05.",
     "The meeting is at three thirty p m on the fifth of march twenty twenty four."),
    ("He ran 10km in 45 minutes and lifted 100kg.",
     "He ran ten kilometers in forty five minutes and lifted one hundred kilograms."),
    ("Let's meet at 7, don't be late!", "Let's meet at seven, don't be late."),
    ("Tom & Jerry, 1+1=2, and 3/4 of the pie.",
     "Tom and Jerry, one plus one equals two, and three quarters of the pie."),
    ("The population grew from 1,000,000 to 2.5 million in 1990.",
     "The population grew from one million to two point five million in nineteen ninety."),
    ("I paid £12.50 for 2 tickets.", "I paid twelve pounds fifty pence for two tickets."),
    ("Room 101 is on the 3rd floor.", "Room one hundred and one is on the third floor."),
    ("It costs ¥500, about 3.5 dollars.", "It costs five hundred yen, about three point five dollars."),
    ("The 1990s had 5~10 hits, ~5 a year.", "The nineteen nineties had five to ten hits, about five a year."),
    ("COVID-19 cases rose 20%.", "COVID nineteen cases rose twenty percent."),
    ("x+1 > 5 and 2×3=6.", "x plus one greater than five and two times three equals six."),
    ("He is 6'2\" tall and #1.", "He is six feet two inches tall and number one."),
]

MIXED = [
    ("我买了3个apple，花了$5。", "我买了三个apple，花了五美元。"),
    ("iPhone 15的价格是5999元。", "iPhone 十五的价格是五千九百九十九元。"),
    ("The meeting is at 3点30分 in 北京.", "The meeting is at 三点三十分 in 北京."),
    ("他说 I have 3 apples", "他说 I have three apples"),
    ("1、2、3", "一、二、三"),
]

PUNCTUATION = [  # no number normaliser needed
    ("时间：下午", "时间，下午"),
    ("Let's go, don't stop", "Let's go, don't stop"),
    ("It’s John’s book", "It's John's book"),
    ("他说：“好的！”你呢？", "他说，好的。你呢。"),
    ("Hello world? Yes!", "Hello world. Yes."),
    ("Wait... what?!", "Wait. what."),
    ("Off — today only!", "Off, today only."),
    ("a well-known (famous) place - really", "a well known, famous, place, really"),
    ("『你好』「世界」", "，你好，世界，"),
    ("等等……", "等等。"),
]

BROAD = [s for s, _ in ZH + EN + MIXED] + [
    "A4纸100张", "MP3和MP4", "5G网络", "8GB内存，512GB硬盘", "打120或者110", "约~5公里", "(1) 第一点",
    "第3届大会于2024.3.5召开。", "我的工号是#12345。", "1‰的概率", "阅读量10万+", "3.5亿美元", "凌晨2:05",
    "1/2杯水", "零下10℃", "Windows 11", "Python 3.11", "H2O", "4K video at 60fps", "1080p", "A/B testing",
    "24/7 support", "rock & roll", "50 ¢", "Q3 2024 results", "call 911", "1-800-FLOWERS", "https://example.com",
    "user_name@mail.example.org", "1:2:3", "12:45:30", "37.5°C", "100°F", "45°", "1 1/2 cups", "$0.99",
    "€1.01", "$3.5 million", "1e10", "2^10", "√2 ≈ 1.414", "a ≥ b ≠ c", "+5", "-12.5", "100€ please",
    "No. 5 is mine", "the '80s", "Tracking SF1234567890", "a 5000 mAh battery", "RTX4090显卡",
    "1st-class tickets cost $1,200.", "© 2024 Company™", "50% off — today only!",
]


@pytest.fixture(scope="module")
def norm() -> Normalizer:
    return Normalizer()


def say(norm: Normalizer, text: str) -> str:
    return norm(text, do_homophone_replacement=False)


@pytest.mark.parametrize(("text", "spoken"), ZH + EN + MIXED)
def test_sentences_read_aloud(norm: Normalizer, text: str, spoken: str) -> None:
    assert say(norm, text) == spoken


@pytest.mark.parametrize(("text", "folded"), PUNCTUATION)
def test_punctuation_maps_to_marks_the_model_reads(text: str, folded: str) -> None:
    assert say(Normalizer(load_defaults=False), text) == folded


def test_zh_quotes_around_english_keep_the_apostrophe() -> None:
    # zh maps "'" to "‘" (upstream); inside a word it comes back as "'".
    assert say(Normalizer(load_defaults=False), "我说let's go") == "我说let's go"
    assert Normalizer(load_defaults=False)("我说let's go", lang="zh", do_homophone_replacement=False) == "我说let's go"


def test_defaults_are_the_spoken_normalisers(norm: Normalizer) -> None:
    assert {name: type(fn) for name, fn in norm.normalizers.items()} == {"zh": SpokenText, "en": SpokenText}


def test_no_digit_survives_and_nothing_is_dropped(norm: Normalizer, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        outputs = {text: say(norm, text) for text in BROAD}
    assert caplog.records == []  # everything in BROAD can be said: no "dropped characters" warning
    for text, out in outputs.items():
        assert not re.search(r"\d", out), (text, out)
        assert normalizer_module.invalid_characters(out) == set(), (text, out)
        chinese = [c for c in text if "\u4e00" <= c <= "\u9fff"]
        assert _is_subsequence(chinese, out), (text, out)  # no Chinese character lost on the way


def test_outputs_use_only_known_tokens(norm: Normalizer, shared_assets) -> None:
    tok = Tokenizer(shared_assets / "tokenizer")
    for text in BROAD + [s for s, _ in PUNCTUATION]:
        assert UNK not in tok.encode(norm(text)), text


def test_unreadable_characters_are_named_when_dropped(norm: Normalizer, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        assert say(norm, "emoji 😀 here ☃") == "emoji  here "
    assert "dropped characters the model cannot read: ☃ 😀" in caplog.text


def test_tags_are_kept_and_numbers_between_them_read(norm: Normalizer) -> None:
    assert say(norm, "[laugh]我有3个[uv_break]苹果，共5元") == "[laugh]我有三个[uv_break]苹果，共五元"


def test_language_runs_split_mixed_text() -> None:
    runs = language_runs("The meeting is at 3点30分 in 北京.", "en")
    assert runs == [("en", "The meeting is at "), ("zh", "3点30分 "), ("en", "in "), ("zh", "北京.")]
    assert language_runs("25 %", "zh") == [("zh", "25 %")]
    assert "".join(r for _, r in language_runs(" a 1 二 ", "en")) == " a 1 二 "


def test_spoken_text_rejects_unknown_language() -> None:
    with pytest.raises(ValueError, match="lang"):
        SpokenText("fr")


def test_wetext_failures_fall_back_word_by_word(norm: Normalizer) -> None:
    # wetext's English grammar asserts on "+1"; the other words are still read, and after_wetext
    # turns what is left into words.
    reader = norm.normalizers["en"]
    assert reader.say("+1 800 x", "en") == "+1 eight hundred x"
    assert say(norm, "10^3 +1") == "ten circumflex three plus one"


def test_without_wetext_todays_behaviour_and_one_warning(monkeypatch, caplog) -> None:
    for module in ("wetext", "tn", "nemo_text_processing"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    monkeypatch.setattr(normalizer_module, "_warned_missing", set())
    with caplog.at_level(logging.WARNING):
        first, second = Normalizer(), Normalizer()
    missing = [r for r in caplog.records if "wetext" in r.getMessage()]
    assert len(missing) == 1 and "zh and en" in missing[0].getMessage()
    assert first.normalizers == {} == second.normalizers
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert say(first, "价格是25元，时间是2024年3月5日") == "价格是元，时间是年月日"
    assert "dropped characters the model cannot read: 0 2 3 4 5" in caplog.text


def test_chat_normalizer_reads_numbers() -> None:
    from chattts_velocity import Chat

    assert Chat().normalizer("价格是25元", do_homophone_replacement=False) == "价格是二十五元"


def _is_subsequence(items: list[str], text: str) -> bool:
    position = 0
    for item in items:
        position = text.find(item, position)
        if position < 0:
            return False
        position += len(item)
    return True
