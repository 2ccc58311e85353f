"""`instructions` grammar and how speed, instructions and SSML combine into one speech plan."""
from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from chattts_velocity.schema import CODE_PROMPT  # noqa: E402 (after the importorskip above)
from chattts_velocity.serve.instructions import parse_instructions, speech_input  # noqa: E402 (after the importorskip above)


@pytest.mark.parametrize("text, speed, refine", [
    (None, None, None), ("", None, None), ("  ", None, None), ("speed 2", 2, None), ("[speed_7]", 7, None),
    ("Very slow.", 1, None), ("fast", 7, None), ("oral 3", None, "[oral_3]"),
    ("break 6, laugh 1; oral_2", None, "[oral_2][laugh_1][break_6]"), ("refine", None, ""),
    ("no refine\nspeed: 4", 4, None), ("LAUGH=2, refine", None, "[laugh_2]"),
])
def test_understood_instructions(text, speed, refine) -> None:
    controls = parse_instructions(text)
    assert controls.speed == speed and controls.refine_prompt() == refine


@pytest.mark.parametrize("text, why", [
    ("speak like a pirate", "cannot honour 'speak like a pirate'"), ("speed 10", "speed 0-9"), ("laugh 3", "laugh 0-2"),
    ("break 8", "break 0-7"), ("refine beams 0", "refine beams 1-8"), ("refine beams 9", "refine beams 1-8"),
    ("refine beams 2, refine beams 3", "beams twice"), ("slow, fast", "speed twice"), ("oral 1, oral 2", "oral twice"),
    ("no refine, oral 2", "choose one"), ("x" * 4097, "at most 4096"), ("speed", "cannot honour"),
])
def test_everything_else_is_refused_naming_instructions(text, why) -> None:
    with pytest.raises(ValueError) as err:
        parse_instructions(text)
    assert str(err.value).startswith("instructions: ") and why in str(err.value)


def test_the_speed_is_set_in_one_place() -> None:
    assert speech_input("Hi.", 1.0, None, None).prompt == CODE_PROMPT  # normal speed: the default prompt
    assert speech_input("Hi.", 2.0, None, None).prompt == "[speed_8]"
    assert speech_input("Hi.", 1.0, "speed 1", None).prompt == "[speed_1]"
    ssml = speech_input('<speak><prosody rate="50%">Hi.</prosody></speak>', 1.0, "oral 1", 9)
    assert (ssml.text, ssml.prompt, ssml.refine.prompt, ssml.refine.manual_seed) == ("Hi.", "[speed_2]", "[oral_1]", 9)
    for speed, instructions, text, field in [(2.0, "fast", "Hi.", "instructions"),
                                             (2.0, None, '<speak><prosody rate="fast">x</prosody></speak>', "input"),
                                             (1.0, "slow", '<speak><prosody rate="fast">x</prosody></speak>', "input")]:
        with pytest.raises(ValueError, match=f"^{field}: sets the speed"):
            speech_input(text, speed, instructions, None)
    with pytest.raises(ValueError, match="^input: the SSML holds nothing"):
        speech_input('<speak><break/></speak>', 1.0, None, None)


def test_refine_beams_turn_the_refine_pass_into_a_beam_search() -> None:
    plan = speech_input("Hi.", 1.0, "refine beams 4, oral 2", 5)
    assert (plan.refine.beam_width, plan.refine.prompt) == (4, "[oral_2]")
    assert speech_input("Hi.", 1.0, "refine", None).refine.beam_width == 1
    assert speech_input("Hi.", 1.0, None, None).refine is None
