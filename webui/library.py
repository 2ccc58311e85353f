"""Web UI voice library callbacks: save the current voice by name, pick a saved one into the voice fields,
delete it. The voices are chattts_velocity.text.voices' files, shared with the server and the export; a speaker
string is saved only when the model can use it (`fits`: the server's own check, voice_check.VoiceCheck.fits)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr

from chattts_velocity.text.voices import VoiceExists, VoiceLibrary

from .controls import CUSTOM
from .handlers import warn


class LibraryHandlers:
    def __init__(self, library: VoiceLibrary, fits: Callable[[str], object] | None = None) -> None:
        self.library, self.fits = library, fits  # fits: ValueError naming `speaker` for one the model cannot use

    def names(self) -> list[str]:
        return [voice.name for voice in self.library.list()]

    def refresh(self) -> dict[str, Any]:
        """The dropdown's choices from disk (voices saved through the server show up on page load)."""
        return gr.update(choices=self.names())

    def save(self, name: str, speaker: str, clip_code: str, transcript: str) -> tuple[object, object, str]:
        """Save what Generate would speak with (a clip code wins over the speaker string) -> (dropdown, name box,
        stats line); the answer is a toast and a line in the stats box, success or not."""
        clip_code, speaker = (clip_code or "").strip(), (speaker or "").strip()
        fields = {"clip_code": clip_code, "transcript": (transcript or "").strip()} if clip_code else \
            {"speaker": speaker or None}
        try:
            if speaker and not clip_code and self.fits is not None:
                self.fits(speaker)
            voice = self.library.save(name or "", **fields)
        except VoiceExists:  # the library's own advice (overwrite) is the server's; the page has Delete
            taken = ValueError(f"name: {name.strip()!r} is taken (names ignore letter case); pick another name, "
                               "or delete that voice first")
            return gr.skip(), gr.skip(), _refused(taken)
        except ValueError as exc:
            return gr.skip(), gr.skip(), _refused(exc)
        return gr.update(choices=self.names(), value=voice.name), "", _done(f"saved voice {voice.name!r}")

    def pick(self, name: str | None) -> tuple[object, ...]:
        """A saved voice -> (speaker, clip code, transcript, preset, audio seed, stats line). The seed box is
        cleared: a seed makes its own speaker string, which would replace the picked one."""
        if not name:
            return (gr.skip(),) * 6
        try:
            voice = self.library.get(name)
        except ValueError as exc:
            return (*(gr.skip(),) * 5, _refused(exc))
        return (voice.speaker or "", voice.clip_code or "", voice.transcript or "", CUSTOM, None,
                _done(f"voice {voice.name!r} picked; a new audio seed would replace it"))

    def delete(self, name: str | None) -> tuple[object, str]:
        """-> (dropdown, stats line)."""
        try:
            if not name:
                raise ValueError("voice: pick a saved voice to delete")
            self.library.delete(name)
        except ValueError as exc:
            return gr.skip(), _refused(exc)
        return gr.update(choices=self.names(), value=None), _done(f"deleted voice {name!r}")


def _done(message: str) -> str:
    gr.Info(message, duration=3)
    return message


def _refused(exc: ValueError) -> str:
    warn(exc)
    return f"error: {exc}"
