"""The SSML subset: each supported tag's mapping, and every refusal a ValueError naming `input` and the position."""
from __future__ import annotations

import pytest

from chattts_velocity.text.ssml import is_ssml, parse_ssml


def speak(body: str, attrs: str = "") -> str:
    return parse_ssml(f"<speak{attrs}>{body}</speak>").text


@pytest.mark.parametrize("tag, token", [
    ('<break time="500ms"/>', "[uv_break]"), ('<break time="0.9s"/>', "[uv_break]"), ('<break time="1s"/>', "[lbreak]"),
    ('<break time="2500ms"/>', "[lbreak]"), ("<break/>", "[uv_break]"), ('<break strength="weak"/>', "[uv_break]"),
    ('<break strength="x-strong"/>', "[lbreak]"), ('<break strength="none"/>', ""), ('<break time="0ms"/>', ""),
    ('<break strength="strong" time="200ms"/>', "[uv_break]"),  # time wins, as in SSML
])
def test_breaks_become_pause_tokens(tag: str, token: str) -> None:
    assert speak(f"One{tag}two.") == " ".join(filter(None, ["One", token, "two."]))


@pytest.mark.parametrize("rate, factor", [("x-slow", 0.5), ("slow", 0.75), ("medium", 1.0), ("fast", 1.5),
                                          ("x-fast", 2.0), ("150%", 1.5), ("0.5", 0.5), ("25%", 0.25)])
def test_prosody_rate_is_a_speed_factor(rate: str, factor: float) -> None:
    result = parse_ssml(f'<speak>Hi <prosody rate="{rate}">there</prosody>.</speak>')
    assert result.rate == factor and result.text == "Hi there."


def test_say_as_sub_and_languages() -> None:
    assert speak('Call <say-as interpret-as="characters">IBM7</say-as>.') == "Call I B M seven."
    assert speak('<say-as interpret-as="cardinal">1234</say-as> ships') == \
        "one thousand two hundred and thirty four ships"
    assert speak('On <say-as interpret-as="date" format="dmy">5/3/2024</say-as>.') == \
        "On the fifth of march twenty twenty four."
    assert speak('<sub alias="World Wide Web">WWW</sub> &amp; more') == "World Wide Web & more"
    assert speak('今天<say-as interpret-as="date">2024-03-05</say-as><break/>好', ' xml:lang="zh-CN"') == \
        "今天二零二四年三月五日[uv_break]好"
    assert speak('<say-as interpret-as="cardinal">25</say-as>个', ' xml:lang="zh"') == "二十五个"
    assert is_ssml("  <speak>x</speak>") and not is_ssml("speak <b>")
    assert parse_ssml('<?xml version="1.0"?>\n<speak version="1.1">Hi.</speak>').text == "Hi."


@pytest.mark.parametrize("source, where", [
    ("<speak>unclosed", "line 1 column 16"),
    ("<speak>\n  <p>x</p></speak>", "line 2 column 3"),
    ('<!DOCTYPE speak [<!ENTITY boom "x">]><speak>&boom;</speak>', "line 1 column"),
    ("<speak>&lol;</speak>", "line 1 column 8"),
    ('<speak><break time="soon"/></speak>', "line 1 column 8"),
    ('<speak><break strength="loud"/></speak>', "line 1 column 8"),
    ('<speak><prosody pitch="high">x</prosody></speak>', "line 1 column 8"),
    ('<speak><prosody rate="9">x</prosody></speak>', "line 1 column 8"),
    ('<speak><prosody rate="slow">a</prosody><prosody rate="fast">b</prosody></speak>', "line 1 column"),
    ('<speak><say-as interpret-as="telephone">1</say-as></speak>', "line 1 column 8"),
    ('<speak><say-as interpret-as="cardinal">12a</say-as></speak>', "line 1 column"),
    ('<speak><say-as interpret-as="date">2024-13-01</say-as></speak>', "line 1 column"),
    ('<speak><say-as interpret-as="date">x<break/></say-as></speak>', "line 1 column 37"),
    ('<speak><sub>x</sub></speak>', "line 1 column 8"),
    ("<speak><speak>x</speak></speak>", "line 1 column 8"),
    ("<speak>a</speak><speak>b</speak>", "line 1 column 17"),
])
def test_malformed_or_unsupported_ssml_names_input_and_the_position(source: str, where: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_ssml(source)
    assert str(err.value).startswith("input: ") and where in str(err.value)
