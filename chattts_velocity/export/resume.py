"""Batch export, resuming: which of a plan's lines an earlier run already made, judged from the record and the files.

A WAV is trusted only when the record holds it for the same request and it still has the recorded digest. What sits
under an output's name is looked at without following it: a symbolic link, FIFO, device or folder there fails its
line with a message saying so (opening a FIFO would wait forever), and is never read or written through.
"""
from __future__ import annotations

from pathlib import Path

from .line import ExportLine
from .manifest import file_digest, wav_seconds
from .names import SIDECAR_SUFFIX
from .record import read_record
from .safe_files import UnsafeFile, check_inside, file_kind, unsafe

REGULAR = "a regular file"


def mark_finished(out_dir: Path, todo: list[ExportLine], timestamps: bool, captions: str | None = None) -> None:
    """Skip lines whose WAV is complete, recorded for the same request, unchanged since (its digest) and with every
    sidecar the run asks for (timestamps, captions "srt"/"vtt"); any other WAV is made again; a line whose output is not
    a regular file fails."""
    record = read_record(out_dir)
    for line in todo:
        path = out_dir / line.file
        try:
            _check_output(out_dir, line.file, captions)
        except UnsafeFile as exc:
            line.status, line.error = "error", str(exc)
            continue
        before = record.get(line.file, {})
        seconds = wav_seconds(path)
        if seconds is None or before.get("status") not in ("ok", "skipped") or before.get("request") != line.request:
            continue
        if before.get("audio") is not None and file_digest(path) != before["audio"]:
            continue  # another run's audio under this name
        if timestamps and file_kind(path.with_suffix(SIDECAR_SUFFIX)) != REGULAR:
            continue
        if captions and file_kind(path.with_suffix(f".{captions}")) != REGULAR:
            continue
        line.status, line.reason, line.duration = "skipped", "already exported", round(seconds, 3)
        line.seed, line.audio = before.get("seed"), before.get("audio")  # what made the file on disk


def _check_output(out_dir: Path, name: str, captions: str | None) -> None:
    """UnsafeFile unless the output's folder stays inside the output folder and its WAV and sidecar names hold
    nothing or a regular file."""
    path = out_dir / name
    check_inside(out_dir, path)
    sidecars = [path.with_suffix(f".{captions}")] if captions else []
    for target in (path, path.with_suffix(SIDECAR_SUFFIX), *sidecars):
        kind = file_kind(target)
        if kind not in (None, REGULAR):
            raise unsafe(target, kind, "output")
