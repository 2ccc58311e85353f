"""Batch export, one line: an input line and what became of it (one manifest entry)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ExportLine:
    """One input line and what became of it (one manifest entry)."""

    line: int  # 1-based line number in the input file
    text: str
    id: str | None = None
    output: str | None = None  # relative to the output folder, "/"-separated
    seed: int | None = None
    speaker: str | None = None
    voice: str | None = None  # as the server takes it (text.voices.voice_params); its speaker goes to `speaker`
    status: str = "pending"  # pending -> ok (written by this run) | skipped (see reason) | error
    error: str | None = None
    duration: float | None = None  # seconds of audio
    request: str | None = None  # hash of what the line asks for (manifest.request_hash)
    reason: str | None = None  # why a line was skipped: an empty line, or already exported
    audio: str | None = None  # digest of the WAV file as written (manifest.file_digest); a resume checks it

    @property
    def file(self) -> str:
        """`output` of a line that is to run: plan_export names every line it does not fail."""
        if self.output is None:
            raise ValueError(f"line {self.line}: has no output name ({self.status})")
        return self.output
