"""Batch export, planning: a text or JSON Lines file (+ an earlier manifest.json) -> an ExportPlan.

Checks and names every line, skips outputs already on disk, fixes seeds; needs no model (export.run_export runs it).
"""
from __future__ import annotations

import json
import random
import re
import sys
import wave
from dataclasses import dataclass, field
from pathlib import Path

from ..audio.formats import WAV
from ..schema import check_sampling
from ..text import decode_spk_emb

MANIFEST = "manifest.json"
FIELDS = ("text", "id", "speaker", "seed", "output")


@dataclass
class ExportLine:
    """One non-blank input line and what became of it (one manifest entry)."""

    line: int  # 1-based line number in the input file
    text: str
    id: str | None = None
    output: str | None = None  # relative to the output folder, "/"-separated
    seed: int | None = None
    speaker: str | None = None
    status: str = "pending"  # pending -> ok (written by this run) | skipped (by an earlier one) | error
    error: str | None = None
    duration: float | None = None  # seconds of audio


@dataclass
class ExportPlan:
    input: str
    out_dir: Path
    lines: list[ExportLine] = field(repr=False)
    speaker_widths: dict[str, int] = field(default_factory=dict, repr=False)  # speaker string -> its width

    @property
    def todo(self) -> list[ExportLine]:
        return [line for line in self.lines if line.status == "pending"]

    def count(self, status: str) -> int:
        return sum(line.status == status for line in self.lines)

    @property
    def succeeded(self) -> int:
        return self.count("ok") + self.count("skipped")

    @property
    def manifest(self) -> Path:
        return self.out_dir / MANIFEST


def read_input(path: str | Path) -> tuple[list[tuple[int, str]], bool]:
    """(line number, line) for every non-blank line, and whether the input is JSON Lines. "-" is stdin."""
    try:
        raw = sys.stdin.read() if str(path) == "-" else Path(path).read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        where = f"{exc.reason} at byte {exc.start}"
        raise ValueError(f"input: {path} is not UTF-8 ({where}); save it as UTF-8") from None
    rows = [(n, s.rstrip("\r")) for n, s in enumerate(raw.split("\n"), start=1) if s.strip()]
    if not rows:
        raise ValueError(f"input: {path} has no non-blank lines; give one utterance (or JSON object) per line")
    return rows, Path(str(path)).suffix.lower() == ".jsonl" or rows[0][1].lstrip().startswith("{")


def plan_export(input_path: str | Path, out_dir: str | Path, seed: int | None = None,
                speaker: str | None = None) -> ExportPlan:
    """Parse and name every line, skip finished outputs, fix each remaining line's seed.

    With `seed` S, line k uses S + k - 1 unless it gives its own; without, each line to run draws a
    random seed (recorded in the manifest). Bad lines get status "error"; a bad argument raises ValueError.
    """
    widths: dict[str, int] = {}
    if seed is not None:
        _check_seed(seed, "seed")
    if speaker is not None:
        _speaker_width(speaker, widths)
    rows, jsonl = read_input(input_path)
    plan = ExportPlan(str(input_path), Path(out_dir), [], widths)
    plan.lines = [_parse(n, raw, jsonl, speaker, plan) for n, raw in rows]
    _reject_duplicates(plan.lines)
    _mark_finished(plan)
    _assign_seeds(plan, seed)
    return plan


def _parse(number: int, raw: str, jsonl: bool, speaker: str | None, plan: ExportPlan) -> ExportLine:
    line = ExportLine(number, raw.strip(), speaker=speaker)
    try:
        if jsonl:
            _fill_from_json(line, raw, plan.speaker_widths)
        line.output = _output_name(line, plan.out_dir)
    except ValueError as exc:
        line.status, line.error = "error", str(exc)
    return line


def _fill_from_json(line: ExportLine, raw: str, widths: dict[str, int]) -> None:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError('expected a JSON object such as {"text": "Hello."}')
    if set(obj) - set(FIELDS):
        raise ValueError(f"unknown field(s) {sorted(set(obj) - set(FIELDS))}; the fields are {list(FIELDS)}")
    text, ident = obj.get("text"), obj.get("id")
    if not isinstance(text, str) or not text.strip():
        raise ValueError('text: missing or empty; every line needs a non-empty "text"')
    line.text = text.strip()
    if ident is not None and (isinstance(ident, bool) or not isinstance(ident, (str, int))):
        raise ValueError(f"id: must be a string or an integer, got {ident!r}")
    line.id = None if ident is None else str(ident)
    line.output = obj.get("output")
    if obj.get("seed") is not None:
        line.seed = _check_seed(obj["seed"], "seed")
    if obj.get("speaker") is not None:
        line.speaker = obj["speaker"]
        _speaker_width(line.speaker, widths)


def _check_seed(value: object, name: str) -> int:
    check_sampling({"seed": value}, {"seed": name})
    return value


def _speaker_width(speaker: object, widths: dict[str, int]) -> None:
    """Decode once per distinct string to validate it; run_export checks the width against the model."""
    if not isinstance(speaker, str):
        raise ValueError(f"speaker: must be a speaker string from sample_random_speaker(), got {speaker!r}")
    if speaker not in widths:
        widths[speaker] = decode_spk_emb(speaker).numel()


def _output_name(line: ExportLine, root: Path) -> str:
    """An explicit output (inside the folder) wins, then the sanitised id, then the line number."""
    if line.output is not None:
        return _checked_output(line.output, root)
    if line.id is None:
        return f"{line.line:05d}{WAV.extension}"
    # Word characters (any script), dot and dash; no leading dot, so no hidden file and no "..".
    name = re.sub(r"[^\w.\-]+", "_", line.id).lstrip("._")[:120]
    if not name:
        raise ValueError(f'id: {line.id!r} has no characters usable in a file name; add an "output"')
    return name + WAV.extension


def _checked_output(value: object, root: Path) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"output: must be a non-empty path relative to the output folder, got {value!r}")
    if Path(value).is_absolute():
        raise ValueError(f"output: {value!r} is absolute; give a path relative to the output folder")
    if Path(value).suffix.lower() != WAV.extension:
        raise ValueError(f"output: {value!r} must end in {WAV.extension} (the export writes {WAV.name.upper()} files)")
    base = root.resolve()
    target = (base / value).resolve()
    if not target.is_relative_to(base) or target == base:
        raise ValueError(f"output: {value!r} escapes the output folder {root}; keep it inside")
    return target.relative_to(base).as_posix()


def _reject_duplicates(lines: list[ExportLine]) -> None:
    owner: dict[str, int] = {}
    for line in (x for x in lines if x.output is not None):
        key = line.output.casefold()  # a case-insensitive file system would merge these
        if key in owner:
            line.status = "error"
            line.error = f"output: {line.output} is already used by line {owner[key]}; give another id or output"
        owner.setdefault(key, line.line)


def _mark_finished(plan: ExportPlan) -> None:
    """Skip lines whose WAV is complete, unless the last manifest says it was made from other text."""
    try:
        entries = json.loads(plan.manifest.read_text(encoding="utf-8"))["lines"]
        previous = {e["output"]: e for e in entries if e["status"] in ("ok", "skipped")}
    except (OSError, ValueError, KeyError, TypeError):
        previous = {}
    for line in plan.todo:
        seconds = wav_seconds(plan.out_dir / line.output)
        before = previous.get(line.output)
        if seconds is None or (before is not None and before.get("text") != line.text):
            continue
        line.status, line.duration = "skipped", round(seconds, 3)
        if before is not None:  # the seed and voice that made the file on disk
            line.seed, line.speaker = before.get("seed"), before.get("speaker")


def _assign_seeds(plan: ExportPlan, base: int | None) -> None:
    draw = random.SystemRandom()
    for line in plan.lines:
        if line.status == "error" or line.seed is not None:
            continue
        if base is not None:
            line.seed = _check_seed(base + line.line - 1, "seed + line number")
        elif line.status == "pending":
            line.seed = draw.randrange(2**31)


def wav_seconds(path: Path) -> float | None:
    """Length of a complete, non-empty 16-bit mono WAV, or None if missing, cut short or not one."""
    try:
        with wave.open(str(path), "rb") as w:
            n = w.getnframes()
            complete = w.getnchannels() == 1 and w.getsampwidth() == 2 and len(w.readframes(n)) == 2 * n
            return n / w.getframerate() if complete and n > 0 else None
    except (OSError, EOFError, wave.Error):
        return None
