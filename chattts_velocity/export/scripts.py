"""Batch export, scripts: a line with [voice: ...] / [pause: ...] tags (text/script.py), checked and its turn voices
resolved when the plan is made (a bad tag or voice fails its line before the model loads); export/runner.py speaks
its turns in the shard's batch and joins them (speech/script_audio.py)."""
from __future__ import annotations

from collections.abc import Callable

from ..audio.wav import SAMPLE_RATE
from ..text.script import parse_script
from ..text.voices import VoiceFields, VoiceLibrary, voice_params
from .line import ExportLine


def resolve_scripts(lines: list[ExportLine], turn_voices: dict[str, VoiceFields], voices: VoiceLibrary | None,
                    speaker_for_seed: Callable[[int], str]) -> None:
    """Each pending script line's turn voices into `turn_voices` (the plan's); a bad tag or voice fails the line."""
    library: VoiceLibrary | None = voices
    for line in lines:
        if line.status != "pending":
            continue
        try:
            script = parse_script(line.text, SAMPLE_RATE, "text")
            for voice in [] if script is None else sorted({t.voice for t in script.turns if t.voice is not None}):
                if voice not in turn_voices:
                    library = library if library is not None else VoiceLibrary()
                    turn_voices[voice] = _resolve(voice, library, speaker_for_seed)
        except ValueError as exc:
            line.status, line.error = "error", str(exc)


def _resolve(voice: str, library: VoiceLibrary, speaker_for_seed: Callable[[int], str]) -> VoiceFields:
    try:
        return voice_params(voice, library, speaker_for_seed)
    except ValueError as exc:
        raise ValueError(f"text: [voice: {voice[:40]}]: {str(exc).split(': ', 1)[-1]}") from None


def script_record(turn_voices: dict[str, VoiceFields], line: ExportLine) -> dict[str, object]:
    """What a script line's request hash adds: its turn voices as resolved (empty for a plain line, so its hash is
    the one earlier runs recorded)."""
    script = parse_script(line.text, SAMPLE_RATE, "text")
    voices = [] if script is None else sorted({t.voice for t in script.turns if t.voice is not None})
    return {"turn_voices": {voice: turn_voices[voice] for voice in voices}} if voices else {}
