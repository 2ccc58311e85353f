"""Batch export, the record kept in the output folder, so that a crash at any moment loses only lines in flight.

manifest.journal: one JSON line per finished WAV, appended and fsync'd as the WAV lands: the only file that grows
while lines finish. manifest.json: every input line (status, seed, request hash, and the sha256 and length of its
text, never the text itself) plus the run's model, precision and sampling parameters; written once when a run ends
(done, failed or interrupted), folding the journal in and emptying it. So a line's entry has a bounded size
whatever the line holds, and a run writes the manifest once, not per line or per batch.

Both files are read back as untrusted: opened only as regular files (safe_files), and a document or entry of the
wrong shape is one ValueError naming the file (a torn last journal line, left by a crash, is ignored).
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from .line import ExportLine
from .manifest import JOURNAL, MANIFEST, Json, replace_atomically, text_digest
from .safe_files import open_regular, read_regular

MAX_RECORDED_CHARS = 500  # an id, voice or error message longer than this is cut in the record
_NONE = type(None)
# what a resume reads of an entry, and the JSON types it must have
_ENTRY_FIELDS: dict[str, tuple[type, ...]] = {"output": (str, _NONE), "status": (str,), "request": (str, _NONE),
                                              "audio": (str, _NONE), "seed": (int, _NONE)}


def line_entry(line: ExportLine) -> Json:
    """One line as the record keeps it: its text and speaker as digests, long strings cut."""
    entry = dataclasses.asdict(line)
    text, speaker = entry.pop("text"), entry.pop("speaker")
    entry.update(text_sha256=text_digest(text), chars=len(text),
                 speaker_sha256=None if speaker is None else text_digest(speaker))
    for name in ("id", "voice", "error"):
        if isinstance(entry[name], str) and len(entry[name]) > MAX_RECORDED_CHARS:
            entry[name] = entry[name][:MAX_RECORDED_CHARS] + "..."
    return entry


def read_record(out_dir: Path) -> dict[str, Json]:
    """output -> its latest recorded entry: manifest.json, then the journal's lines."""
    entries = [(MANIFEST, i, e) for i, e in enumerate(_manifest_lines(out_dir / MANIFEST), 1)]
    entries += [(JOURNAL, i, e) for i, e in _journal_lines(out_dir / JOURNAL)]
    for name, where, entry in entries:
        _check_entry(out_dir / name, where, entry)
    return {e["output"]: e for _, _, e in entries if e.get("output")}


def _manifest_lines(path: Path) -> list[Any]:
    raw = read_regular(path)
    if raw is None:
        return []
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise _wrong_shape(path, f"is not JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("lines"), list):
        raise _wrong_shape(path, 'is not an object with a "lines" list')
    lines: list[Any] = doc["lines"]
    return lines


def _journal_lines(path: Path) -> list[tuple[int, Any]]:
    raw = read_regular(path)
    found = []
    for number, text in enumerate((raw or b"").decode("utf-8", "replace").splitlines(), 1):
        try:
            found.append((number, json.loads(text)))
        except (ValueError, RecursionError):
            continue  # a line torn by a crash mid-append
    return found


def _check_entry(path: Path, where: int, entry: object) -> None:
    if not isinstance(entry, dict):
        raise _wrong_shape(path, f"entry {where} is {type(entry).__name__}, not an object")
    for name, types in _ENTRY_FIELDS.items():
        value = entry.get(name)
        if not isinstance(value, types) or isinstance(value, bool):
            raise _wrong_shape(path, f'entry {where}: "{name}" is {json.dumps(value)[:40]}')


def _wrong_shape(path: Path, what: str) -> ValueError:
    return ValueError(f"{path.name}: {path} {what}; it is not a record this export wrote. Remove it (the WAVs it "
                      "listed are then made again) or choose another output folder")


def append_journal(out_dir: Path, entry: Json) -> None:
    """One finished line, on disk before this returns."""
    data = (json.dumps(entry, ensure_ascii=False) + "\n").encode("utf-8")
    fd = open_regular(out_dir / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_record(out_dir: Path, doc: Json) -> Path:
    """manifest.json, atomically, one line entry per text line; it now holds everything the journal did, so the
    journal goes."""
    head = {key: value for key, value in doc.items() if key != "lines"}
    lines = ",\n".join("  " + json.dumps(entry, ensure_ascii=False) for entry in doc["lines"])
    body = json.dumps(head, ensure_ascii=False, indent=1).removesuffix("\n}") + f',\n "lines": [\n{lines}\n ]\n}}\n'
    replace_atomically(out_dir / MANIFEST, lambda tmp: tmp.write_text(body, encoding="utf-8"))
    (out_dir / JOURNAL).unlink(missing_ok=True)
    return out_dir / MANIFEST
