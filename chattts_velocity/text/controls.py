"""Text stage: the prompts' control tokens ([speed_N], [oral_N], [laugh_N], [break_N]) and their ranges.

The ChatTTS tokenizer holds [speed_0..9], [oral_0..9], [laugh_0..2] and [break_0..7]; a level outside that range is
not one token but several pieces of text the model reads as words, so every entry point checks it here.
"""
from __future__ import annotations

import re

from ..schema import CODE_PROMPT

CONTROL_LEVELS = {"speed": 9, "oral": 9, "laugh": 2, "break": 7}  # control -> its highest level
_CONTROL = re.compile(r"\[(speed|oral|laugh|break)_(\d+)\]")
_DEFAULT_SPEED = _CONTROL.fullmatch(CODE_PROMPT)
assert _DEFAULT_SPEED is not None  # CODE_PROMPT is one [speed_N] token
# upstream's defaults: the code prompt's speed; the web UI's refine prompt "[oral_2][laugh_0][break_6]"
DEFAULT_LEVELS = {"speed": int(_DEFAULT_SPEED.group(2)), "oral": 2, "laugh": 0, "break": 6}


def control_token(control: str, level: int) -> str:
    """The token of `control` at `level` ("speed", 5 -> "[speed_5]"); ValueError naming the control."""
    if control not in CONTROL_LEVELS:
        raise ValueError(f"control: must be one of {sorted(CONTROL_LEVELS)}, got {control!r}")
    high = CONTROL_LEVELS[control]
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= high:
        raise ValueError(f"{control}: must be a whole number from 0 to {high}, got {level!r}")
    return f"[{control}_{level}]"


def check_controls(prompt: str, field: str = "prompt") -> str:
    """`prompt` itself if each of its control tokens is in range; else a ValueError naming `field`."""
    if not isinstance(prompt, str):
        raise ValueError(f"{field}: expected a string, got {type(prompt).__name__}")
    for match in _CONTROL.finditer(prompt):
        control, digits = match.group(1), match.group(2)
        if len(digits) > 1 or int(digits) > CONTROL_LEVELS[control]:  # every highest level is one digit
            raise ValueError(f"{field}: {match.group(0)} is not a control token; {control} levels are 0 to "
                             f"{CONTROL_LEVELS[control]}")
    return prompt
