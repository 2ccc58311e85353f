"""Scripts: [voice: NAME] and [pause: N] tags -> turns and exact silences; ChatTTS's own tokens untouched; a bad tag
named in the error."""
from __future__ import annotations

import pytest

from chattts_velocity.text.script import MAX_PAUSE_S, Turn, is_script, parse_script

RATE = 24000


def test_plain_text_and_chattts_tokens_are_no_script() -> None:
    for text in ("Hello there.", "Hi [uv_break] you [laugh] [speed_5]", "[voices] and [pauses] [voice_x]"):
        assert parse_script(text, RATE) is None and not is_script(text)


def test_turns_take_the_voice_in_force_and_pauses_are_exact_samples() -> None:
    script = parse_script("Hello [uv_break] there. [pause: 500ms] [voice: echo] Hi! [pause:1.5s][pause = 0.25 s]"
                          "[VOICE: alloy(2)+1234(1)] Shall we? [pause: 1ms]", RATE)
    assert script is not None
    assert script.turns == [Turn("Hello [uv_break] there.", None, 0), Turn("Hi!", "echo", 12000),
                            Turn("Shall we?", "alloy(2)+1234(1)", 36000 + 6000)]
    assert script.pause_after == 24 and script.texts == ["Hello [uv_break] there.", "Hi!", "Shall we?"]


def test_a_leading_pause_and_a_voice_change_alone_make_one_turn() -> None:
    script = parse_script("[pause: 2s][voice: 7] Only me.", RATE)
    assert script is not None and script.turns == [Turn("Only me.", "7", 48000)] and script.pause_after == 0


def test_fractions_of_a_sample_round_once_to_the_nearest() -> None:
    script = parse_script("a [pause: 0.00001s] b [pause: .02083ms] c", RATE)  # 0.24 and 0.49992 samples
    assert script is not None and [t.pause_before for t in script.turns] == [0, 0, 0]
    script = parse_script("a [pause: 0.0000625s] b", RATE)  # 1.5 samples: half to even
    assert script is not None and script.turns[1].pause_before == 2


@pytest.mark.parametrize("text, says", [
    ("a [pause: 2] b", "'[pause: 2]' has no duration"), ("a [pause: -1s] b", "'[pause: -1s]' has no duration"),
    ("a [pause: 1.5h] b", "no duration"), ("a [pause: nan s] b", "no duration"),
    (f"a [pause: {MAX_PAUSE_S + 1}s] b", "longer than"), ("a [voice: ] b", "'[voice: ]' is not a script tag"),
    ("a [voice echo] b", "'[voice echo]' is not a script tag"), ("a [voice: echo b", "not closed"),
    ("a [voice: echo [pause: 1s] b", "not closed"), ("[voice: echo] [pause: 1s]", "holds only tags"),
    ("a " + "[pause: 60s] b " * 11, "add up to more than"),
])
def test_bad_tags_are_value_errors_naming_the_field_and_tag(text, says) -> None:
    with pytest.raises(ValueError, match="^input: ") as err:
        parse_script(text, RATE)
    assert says in str(err.value)
    with pytest.raises(ValueError, match="^text: "):
        parse_script(text, RATE, field="text")
