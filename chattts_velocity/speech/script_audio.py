"""Speech of a script (text/script.py): each turn's params from its voice tag, the silences between turns, and the
turns' audio joined into one waveform with every sentence piece's span.

The turns of a script are the texts of one SynthesisJob (one batch on the engine, each text with its own params);
their audio is joined here with exactly `pause_before` zero samples before each turn and `pause_after` after the
last. The server streams the same silences between the same pieces (serve/service.py, `piece_silences`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..audio.timestamps import Spoken, Timeline, sample_span
from ..audio.wav import SAMPLE_RATE
from ..params import InferCodeParams, RefineTextParams
from ..text.script import Script, Turn, parse_script
from ..text.voices import VoiceFields
from .calls import Stop
from .job import SynthesisJob

if TYPE_CHECKING:
    from .pipeline import SpeechPipeline

SILENCE_CHUNK = 24000  # samples per yielded chunk of a long pause (a streamed encoder gets it in pieces)


def plain_script(text: str, sample_rate: int = SAMPLE_RATE) -> Script:
    """A text without tags as a one-turn script (its voice the request's, no pauses)."""
    return Script([Turn(text, None, 0)], 0, sample_rate)


def turn_params(script: Script, params: InferCodeParams, voice_fields: Callable[[str], VoiceFields],
                field: str = "input") -> list[InferCodeParams]:
    """One InferCodeParams per turn: `params` with each voice tag's speaker (text.voices.voice_params through
    `voice_fields`); a voice that does not resolve is a ValueError naming `field` and its tag."""
    resolved: dict[str, InferCodeParams] = {}
    for voice in {turn.voice for turn in script.turns if turn.voice is not None}:
        try:
            resolved[voice] = dataclasses.replace(params, **voice_fields(voice))
        except ValueError as exc:
            raise ValueError(f"{field}: [voice: {voice[:40]}]: {str(exc).split(': ', 1)[-1]}") from None
    return [params if turn.voice is None else resolved[turn.voice] for turn in script.turns]


def scripted(text: str, params: InferCodeParams, voice_fields: Callable[[str], VoiceFields],
             field: str = "input") -> tuple[Script | None, list[InferCodeParams]]:
    """(the text's script or None for a plain text, one params per turn or [params]); ValueError naming `field`."""
    script = parse_script(text, SAMPLE_RATE, field)
    return script, [params] if script is None else turn_params(script, params, voice_fields, field)


def piece_silences(script: Script, owner: Sequence[int]) -> dict[int, int]:
    """Piece index -> samples of silence before it (the first piece of each turn that has a pause), and
    len(owner) -> the pause after the last turn; `owner[k]` is piece k's turn (TextPieces.owner)."""
    silences: dict[int, int] = {}
    for k, turn in enumerate(owner):
        if (k == 0 or owner[k - 1] != turn) and script.turns[turn].pause_before:
            silences[k] = script.turns[turn].pause_before
    if script.pause_after:
        silences[len(owner)] = script.pause_after
    return silences


def silence_chunks(samples: int) -> Iterator[np.ndarray]:
    """`samples` zeros as float32 chunks of at most SILENCE_CHUNK."""
    for start in range(0, samples, SILENCE_CHUNK):
        yield np.zeros(min(SILENCE_CHUNK, samples - start), np.float32)


def join_script(script: Script, spoken: Sequence[Spoken]) -> Spoken:
    """The turns' audio (one Spoken per turn, in order) and the script's silences as one waveform; each piece's
    span is counted in samples, so it is exact to the sample however long the script."""
    if len(spoken) != len(script.turns):
        raise ValueError(f"spoken: expected one per turn ({len(script.turns)}), got {len(spoken)}")
    timeline, parts = Timeline(script.sample_rate), []
    for turn, audio in zip(script.turns, spoken, strict=True):
        timeline.pause(turn.pause_before)
        parts.append(np.zeros(turn.pause_before, np.float32))
        for stamp in audio.timestamps:
            start, end = sample_span(stamp, script.sample_rate)
            timeline.add(stamp.text, end - start)
        parts.append(np.asarray(audio.wav, np.float32))
    timeline.pause(script.pause_after)
    parts.append(np.zeros(script.pause_after, np.float32))
    wav = np.concatenate(parts)
    if len(wav) != timeline.samples:
        raise RuntimeError(f"join_script: {len(wav)} samples but the spans count {timeline.samples}")
    return Spoken(wav, timeline.stamps)


def speak_script(pipeline: SpeechPipeline, script: Script, params: list[InferCodeParams], *,
                 refine: RefineTextParams | None = None, gpt: str | None = None, stop: Stop | None = None,
                 field: str = "text") -> Spoken:
    """A script spoken in one batch (a job of shape "each": every turn at once, each with its params), after a
    refine pass of every turn if `refine`, joined with its silences. A turn that fails is a ValueError naming
    `field` and the turn."""
    texts = script.texts
    if refine is not None:
        refined = pipeline.synthesis(SynthesisJob(texts, refine=refine, refine_only=True, gpt=gpt,
                                                  stop=stop)).run()
        texts = [str(text) for text in refined]  # refine_only: one string per text
    spoken: dict[int, Spoken] = {}
    job = SynthesisJob(list(texts), params, gpt=gpt, timestamps=True, stop=stop, shape="each")
    for i, result in pipeline.synthesis(job).each():
        if isinstance(result, Exception):
            where = f"turn {i + 1} ({script.turns[i].text[:30]!r})" if len(script.turns) > 1 else "the text"
            raise ValueError(f"{field}: {where}: {str(result).split(': ', 1)[-1]}") from None
        assert isinstance(result, Spoken)  # each() with timestamps
        spoken[i] = result
    return join_script(script, [spoken[i] for i in range(len(script.turns))])
