"""The prompts' control tokens: one table of ranges, a token per level, and a prompt's tokens checked."""
from __future__ import annotations

import pytest

from chattts_velocity.text.controls import CONTROL_LEVELS, DEFAULT_LEVELS, check_controls, control_token


def test_every_level_in_range_is_a_token_and_the_rest_are_refused() -> None:
    assert control_token("speed", 5) == "[speed_5]" and control_token("break", 7) == "[break_7]"
    for control, high in CONTROL_LEVELS.items():
        assert 0 <= DEFAULT_LEVELS[control] <= high
        assert check_controls("".join(control_token(control, n) for n in range(high + 1))) != ""
        with pytest.raises(ValueError, match=rf"^{control}: must be a whole number from 0 to {high}"):
            control_token(control, high + 1)
        with pytest.raises(ValueError, match=rf"^prompt: \[{control}_{high + 1}\] is not a control token"):
            check_controls(f"[{control}_{high + 1}]")
    with pytest.raises(ValueError, match="^control:"):
        control_token("pitch", 1)
    with pytest.raises(ValueError, match=r"^instructions: \[oral_"):
        check_controls("[oral_" + "9" * 5000 + "]", field="instructions")  # no int() of a huge number
    assert check_controls("[speed_5][uv_break] plain text [laugh]") == "[speed_5][uv_break] plain text [laugh]"
