"""Serving stage: what a speech body asks for beyond the voice -> the text, the code prompt and the refine pass.

`instructions` is read with a small grammar of ChatTTS's own controls (clauses separated by ",", ";", "." or
newlines, case-insensitive):
    speed N      N = 0..9 (5 normal), also "[speed_N]";  "very slow" 1, "slow" 3, "normal" 5, "fast" 7, "very fast" 9
    oral N       N = 0..9 \
    laugh N      N = 0..2  > refine-text prompt levels: any of them turns the refine pass on with
    break N      N = 0..7 /  the prompt "[oral_N][laugh_N][break_N]" (only the levels given)
    refine       the refine pass with upstream's default (empty) prompt
    refine beams N  the refine pass as a beam search of N = 1..8 beams: the most likely text, not a sampled one
    no refine    no refine pass (the default)
Strict (`--strict-instructions`), anything else is a ValueError naming `instructions` and listing the above. By
default, as OpenAI takes free text, a clause outside the grammar is read for the controls it writes out
(serve/free_text.py) and otherwise ignored; Controls.applied / .ignored report which. An input starting with
`<speak` is SSML (text/ssml.py). The speed may be set once: by `speed`, by the instructions or by <prosody rate>
(by default a second speed from the instructions is ignored, not refused).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..params import SHARED_MAX_BEAMS as MAX_BEAMS
from ..params import InferCodeParams, RefineTextParams
from ..text.controls import CONTROL_LEVELS, control_token
from ..text.ssml import is_ssml, parse_ssml
from ..text.voices import VoiceFields
from .free_text import free_text_levels
from .request import SamplingFields
from .voice_fields import speed_prompt

SPEED_WORDS = {"very slow": 1, "slow": 3, "slower": 3, "normal": 5, "normal speed": 5, "fast": 7, "faster": 7,
               "very fast": 9}
UNDERSTOOD = (f"speed 0-{CONTROL_LEVELS['speed']}", *SPEED_WORDS,
              *(f"{name} 0-{CONTROL_LEVELS[name]}" for name in ("oral", "laugh", "break")), "refine",
              f"refine beams 1-{MAX_BEAMS}", "no refine")
MAX_INSTRUCTIONS_CHARS = 4096  # OpenAI's limit
_CLAUSE_SPLIT = re.compile(r"(?:[,;\n]|\.(?!\d))+")  # not the point of a number ("refine beams 1.5")
_LEVEL = re.compile(r"\[?(speed|oral|laugh|break)[\s_:=]*(\d+)\]?")
_BEAMS = re.compile(r"refine beams?[\s:=]*(\d+)")


@dataclass
class Controls:
    speed: int | None = None  # [speed_N] level
    refine_levels: dict[str, int] | None = None  # {"oral": N, ...}; {} = refine with the default prompt
    no_refine: bool = False
    beams: int = 1  # the refine pass's beam_width
    applied: list[str] = field(default_factory=list)  # each control set, in the grammar's words ("speed 3")
    ignored: list[str] = field(default_factory=list)  # clauses (lower-cased) that set nothing (lenient only)

    def refine_prompt(self) -> str | None:
        """The refine pass's prompt, or None for no refine pass."""
        if self.refine_levels is None:
            return None
        return "".join(control_token(name, self.refine_levels[name]) for name in ("oral", "laugh", "break")
                       if name in self.refine_levels)


def parse_instructions(text: str | None, strict: bool = True) -> Controls:
    """instructions -> Controls. Strict: a ValueError naming `instructions` for what cannot be honoured; else such
    a clause gives the controls free_text_levels finds in it, and is reported as ignored when there are none."""
    controls = Controls()
    if text is not None and (not isinstance(text, str) or len(text) > MAX_INSTRUCTIONS_CHARS):
        raise ValueError(f"instructions: must be a string of at most {MAX_INSTRUCTIONS_CHARS} characters")
    if text is None or not text.strip():
        return controls
    for clause in _CLAUSE_SPLIT.split(text.lower()):
        clause = " ".join(clause.split())
        if not clause:
            continue
        try:
            controls.applied.append(_apply(controls, clause))
        except ValueError:
            if strict:
                raise
            found = [_lenient_level(controls, name, level) for name, level in free_text_levels(clause)]
            controls.applied += [done for done in found if done]
            if not any(found):
                controls.ignored.append(clause)
    return controls


def _lenient_level(controls: Controls, name: str, level: int) -> str | None:
    """The level set (its words), or None where the grammar would refuse it (out of range, set twice)."""
    try:
        return _set_level(controls, name, level)
    except ValueError:
        return None


def _apply(controls: Controls, clause: str) -> str:
    match = _LEVEL.fullmatch(clause)
    if match is not None:
        return _set_level(controls, match.group(1), int(match.group(2)))
    beams = _BEAMS.fullmatch(clause)
    if beams is not None:
        return _set_beams(controls, int(beams.group(1)))
    if clause in SPEED_WORDS:
        return _set_level(controls, "speed", SPEED_WORDS[clause])
    if clause in ("refine", "no refine"):
        if clause == "no refine":
            _refine_allowed(controls, False)
            controls.no_refine = True
        else:
            _refine_allowed(controls, True)
            controls.refine_levels = controls.refine_levels or {}
        return clause
    raise ValueError(f"instructions: cannot honour {clause[:60]!r}; this server understands (separated by commas) "
                     f"{', '.join(repr(u) for u in UNDERSTOOD)}")


def _refine_allowed(controls: Controls, refine: bool) -> None:
    if (controls.no_refine if refine else controls.refine_levels is not None):
        raise ValueError("instructions: asks for 'no refine' and for refine levels; choose one")


def _set_beams(controls: Controls, beams: int) -> str:
    if not 1 <= beams <= MAX_BEAMS:
        raise ValueError(f"instructions: refine beams {beams} is out of range; use refine beams 1-{MAX_BEAMS}")
    if controls.beams != 1:
        raise ValueError("instructions: sets the refine beams twice; give them once")
    _refine_allowed(controls, True)
    controls.beams = beams
    controls.refine_levels = controls.refine_levels or {}
    return f"refine beams {beams}"


def _set_level(controls: Controls, name: str, level: int) -> str:
    if not 0 <= level <= CONTROL_LEVELS[name]:
        raise ValueError(f"instructions: {name} {level} is out of range; use {name} 0-{CONTROL_LEVELS[name]}")
    if name == "speed":
        if controls.speed is not None:
            raise ValueError("instructions: sets the speed twice; give it once")
        controls.speed = level
        return f"speed {level}"
    levels = controls.refine_levels if controls.refine_levels is not None else {}
    if name in levels:
        raise ValueError(f"instructions: sets {name} twice; give it once")
    _refine_allowed(controls, True)
    controls.refine_levels = {**levels, name: level}
    return f"{name} {level}"


@dataclass
class SpeechInput:
    text: str  # what the normaliser and the model read (SSML already turned into text and control tokens)
    prompt: str  # the code pass's [speed_N]
    refine: RefineTextParams | None  # the refine pass, or None
    applied: tuple[str, ...] = ()  # what the instructions set, in the grammar's words (Controls.applied)
    ignored: tuple[str, ...] = ()  # their clauses that set nothing (Controls.ignored)


def speech_input(text: str, speed: float, instructions: str | None, seed: int | None,
                 strict: bool = True) -> SpeechInput:
    """The body's input, speed and instructions as one plan; ValueError naming the field that cannot be met.
    Not strict, the instructions' speed yields to `speed` or <prosody rate> (reported as ignored)."""
    controls = parse_instructions(instructions, strict)
    ssml = parse_ssml(text) if is_ssml(text) else None
    if ssml is not None and not re.sub(r"\[\w+\]", "", ssml.text).strip():
        raise ValueError("input: the SSML holds nothing to speak")
    rate = ssml.rate if ssml is not None else None
    if not strict and controls.speed is not None and (speed != 1.0 or rate is not None):
        said = f"speed {controls.speed}"
        controls.speed = None
        controls.applied.remove(said)
        controls.ignored.append(f"{said} (the speed is set by {'speed' if rate is None else 'input'})")
    sources = [name for name, given in (("speed", speed != 1.0), ("instructions", controls.speed is not None),
                                        ("input", rate is not None)) if given]
    if len(sources) > 1:
        raise ValueError(f"{sources[-1]}: sets the speed and so does {sources[0]!r}; give the speed in one place")
    prompt = speed_prompt(speed if rate is None else rate)  # rate given: the only source (checked above)
    if controls.speed is not None:
        prompt = control_token("speed", controls.speed)
    refine_prompt = controls.refine_prompt()
    refine = None if refine_prompt is None else RefineTextParams(prompt=refine_prompt, manual_seed=seed,
                                                                 show_tqdm=False, beam_width=controls.beams)
    return SpeechInput(ssml.text if ssml is not None else text, prompt, refine, tuple(controls.applied),
                       tuple(controls.ignored))


def code_params(plan: SpeechInput, voice: VoiceFields, sampling: SamplingFields) -> InferCodeParams:
    return InferCodeParams(prompt=plan.prompt, show_tqdm=False, **voice, **sampling)
