"""Batch export, planning: a text or JSON Lines file (+ the record of earlier runs) -> an ExportPlan.

Checks and names every line, skips outputs an earlier run made from the same request, fixes seeds; needs no model
(export.run_export runs it).
"""
from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from ..audio.captions import check_captions
from ..audio.loudness import check_loudness
from ..params import InferCodeParams
from ..schema import check_sampling
from ..text import decode_spk_emb
from ..text.pieces import check_texts, split_pieces
from ..text.voices import VoiceFields, VoiceLibrary, voice_params
from .encoding import check_encodable, make_encodable
from .line import ExportLine
from .lock import lock_folder
from .manifest import MANIFEST, Json, now, params_record, request_hash, text_digest
from .names import output_name
from .record import append_journal, line_entry, write_record
from .resume import mark_finished
from .scripts import resolve_scripts, script_record

FIELDS = ("text", "id", "speaker", "voice", "seed", "output")
TEXT_FIELDS = ("text", "id", "output", "speaker", "voice", "error")  # what the manifest records of a line as text
EMPTY = "empty line"


class ClipPrompt(TypedDict, total=False):
    """A cloned voice's audio prompt, as InferCodeParams takes it."""

    spk_smp: str | None
    txt_smp: str | None


@dataclass
class ExportPlan:
    input: str
    out_dir: Path
    lines: list[ExportLine] = field(repr=False)  # every input line, empty ones included
    speakers: set[str] = field(default_factory=set, repr=False)  # speaker strings checked to decode
    meta: Json = field(default_factory=dict)  # the run's model, precision, sampling parameters and times
    voice_clips: dict[str, ClipPrompt] = field(default_factory=dict, repr=False)  # by voice name
    timestamps: bool = False  # also write each WAV's spans to <output>.timestamps.json (not kept in the manifest)
    captions: str | None = None  # also write each WAV's captions to <output>.srt / .vtt (audio/captions.py)
    turn_voices: dict[str, VoiceFields] = field(default_factory=dict, repr=False)  # a script's [voice: X] -> X's
    release: Callable[[], None] = field(default=lambda: None, repr=False)  # drops the output folder's lock

    @property
    def todo(self) -> list[ExportLine]:
        return [line for line in self.lines if line.status == "pending"]

    @property
    def loudness(self) -> float | None:
        """The LUFS target every WAV is normalised to, or None (part of the request hashes via meta["params"])."""
        loudness: float | None = self.meta["params"].get("loudness")
        return loudness

    def clip_params(self, line: ExportLine) -> ClipPrompt:
        """The line's audio prompt (InferCodeParams spk_smp / txt_smp) when its voice is a cloned clip."""
        return {} if line.voice is None else self.voice_clips.get(line.voice, {})

    def count(self, status: str) -> int:
        return sum(line.status == status for line in self.lines)

    @property
    def texts(self) -> list[ExportLine]:
        """The lines that have something to say (all but the empty ones)."""
        return [line for line in self.lines if line.reason != EMPTY]

    @property
    def succeeded(self) -> int:
        return sum(line.status in ("ok", "skipped") for line in self.texts)

    @property
    def manifest(self) -> Path:
        return self.out_dir / MANIFEST

    def save(self) -> Path:
        """Write manifest.json: every line and the run's description; each distinct speaker string once, under the
        digest its lines record (speaker_sha256)."""
        self.meta["updated"] = now()
        return write_record(self.out_dir, {
            "input": self.input, "output_dir": str(self.out_dir), **self.meta, "total": len(self.texts),
            "succeeded": self.succeeded, "failed": self.count("error"),
            "speakers": {text_digest(s): s for s in sorted({line.speaker for line in self.lines if line.speaker})},
            "lines": [line_entry(line) for line in self.lines]})

    def journal(self, line: ExportLine) -> None:
        """Record one finished line at once (a crash before the next save() keeps it)."""
        append_journal(self.out_dir, line_entry(line))


def read_input(path: str | Path) -> tuple[list[tuple[int, str]], bool]:
    """(line number, line) for every line, and whether the input is JSON Lines. "-" is stdin."""
    try:
        raw = sys.stdin.read() if str(path) == "-" else Path(path).read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        where = f"{exc.reason} at byte {exc.start}"
        raise ValueError(f"input: {path} is not UTF-8 ({where}); save it as UTF-8") from None
    rows = list(enumerate((s.rstrip("\r") for s in raw.removesuffix("\n").split("\n")), start=1))
    filled = [s for _, s in rows if s.strip()]
    if not filled:
        raise ValueError(f"input: {path} has no non-blank lines; give one utterance (or JSON object) per line")
    return rows, Path(str(path)).suffix.lower() == ".jsonl" or filled[0].lstrip().startswith("{")


def plan_export(input_path: str | Path, out_dir: str | Path, seed: int | None = None,
                speaker: str | None = None, params: InferCodeParams | None = None, voice: str | None = None,
                voices: VoiceLibrary | None = None, loudness: float | None = None,
                timestamps: bool = False, speaker_for_seed: Callable[[int], str] | None = None,
                captions: str | None = None) -> ExportPlan:
    """Parse and name every line, skip the outputs an earlier run made for the same request, fix seeds.

    With `seed` S, line k uses S + k - 1 unless it gives its own; without, each line to run draws a
    random seed (recorded in the manifest). `voice` names a saved voice of `voices` (None: the default library)
    for lines without their own speaker or voice; a voice is what the server takes (text.voices.voice_params: a
    saved voice, a preset, a seed, a speaker string), presets and seeds drawn by `speaker_for_seed` (the loaded
    model's sample_random_speaker(seed=...); None: a line naming one fails). `params` is the sampling
    template the run will use (part of each line's request hash), and so is `loudness`, the LUFS target every WAV
    is normalised to (None: as generated).
    With `timestamps` (`captions`: "srt" or "vtt"), a finished WAV without that file is made again. A line with
    [voice]/[pause] tags is a script (export/scripts.py): a bad tag or turn voice fails its line here. The output
    folder is created and locked first (export/lock.py): an unwritable folder or another export into it is a
    ValueError before any work. Bad lines get status "error"; a bad argument raises ValueError.
    """
    speakers: set[str] = set()
    if speaker is not None and voice is not None:
        raise ValueError("voice: given with a speaker; choose one default for the lines")
    if seed is not None:
        _check_seed(seed, "seed")
    if speaker is not None:
        _check_speaker(speaker, speakers)
    record = params_record(params or InferCodeParams())
    if loudness is not None:
        record["loudness"] = check_loudness(loudness)
    captions = check_captions(captions, "--captions")
    rows, jsonl = read_input(input_path)
    release = lock_folder(Path(out_dir))
    plan = ExportPlan(str(input_path), Path(out_dir), [], speakers, {"params": record}, timestamps=timestamps,
                      captions=captions, release=release)
    try:
        fill_lines(plan, rows, jsonl, seed, speaker, voice, voices, speaker_for_seed)
    except BaseException:
        release()  # a record or folder it refuses: the lock goes with the plan
        raise
    return plan


def fill_lines(plan: ExportPlan, rows: list[tuple[int, str]], jsonl: bool, seed: int | None, speaker: str | None,
              voice: str | None, voices: VoiceLibrary | None, speaker_for_seed: Callable[[int], str] | None) -> None:
    """The plan's lines: each row parsed, its voice resolved and its script turns checked (before any model work)."""
    plan.lines = [_parse(n, raw, jsonl, speaker, plan) for n, raw in rows]
    resolve_voices(plan, voice, voices, speaker_for_seed)
    resolve_scripts(plan.lines, plan.turn_voices, voices, speaker_for_seed or _needs_the_model)
    _reject_duplicates(plan.lines)
    _base_seeds(plan, seed)
    for line in plan.todo:
        asked = {**plan.clip_params(line), **script_record(plan.turn_voices, line)}
        line.request = request_hash(line.text, line.speaker, line.seed, plan.meta["params"], asked)
    mark_finished(plan.out_dir, plan.todo, plan.timestamps, plan.captions)
    _draw_seeds(plan)


def _parse(number: int, raw: str, jsonl: bool, speaker: str | None, plan: ExportPlan) -> ExportLine:
    if not raw.strip():
        return ExportLine(number, "", status="skipped", reason=EMPTY)
    line = ExportLine(number, raw.strip(), speaker=speaker)
    try:
        if jsonl:
            _fill_from_json(line, raw, plan.speakers)
        check_encodable(line, TEXT_FIELDS)
        _check_size(line.text)
        line.output = output_name(line.output, line.id, line.line, plan.out_dir)
    except ValueError as exc:
        line.status, line.error = "error", str(exc)
        make_encodable(line, TEXT_FIELDS)
    return line


def _check_size(text: str) -> None:
    """The synthesis's own limits on one text (its characters, its sentences), checked here, before any model work."""
    try:
        split_pieces(check_texts(text))
    except ValueError as exc:
        raise ValueError(str(exc).replace("text[0]:", "text:", 1).replace("several calls", "several lines")) \
            from None


def _fill_from_json(line: ExportLine, raw: str, speakers: set[str]) -> None:
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
        _check_speaker(line.speaker, speakers)
    if obj.get("voice") is not None:
        line.voice = obj["voice"]
        if obj.get("speaker") is not None:
            raise ValueError("voice: given with a speaker; a line takes one or the other")


def _check_seed(value: object, name: str) -> int:
    check_sampling({"seed": value}, {"seed": name})
    assert isinstance(value, int)  # check_sampling accepts only integer seeds
    return value


def _check_speaker(speaker: object, checked: set[str]) -> None:
    """Decode once per distinct string to validate it before the model loads; whether its width fits the model is
    the model's check (a line whose speaker does not fit fails alone, when it runs)."""
    if not isinstance(speaker, str):
        raise ValueError(f"speaker: must be a speaker string from sample_random_speaker(), got {speaker!r}")
    if speaker not in checked:
        decode_spk_emb(speaker)
        checked.add(speaker)


def resolve_voices(plan: ExportPlan, default: str | None, voices: VoiceLibrary | None,
                   speaker_for_seed: Callable[[int], str] | None = None) -> None:
    """Each line's voice -> its speaker (line.speaker) and clip (plan.voice_clips); a bad one fails its line."""
    if default is not None:
        for line in plan.lines:
            if line.status == "pending" and line.voice is None and line.speaker is None:
                line.voice = default
    named = [line for line in plan.lines if line.status == "pending" and line.voice is not None]
    library = voices if voices is not None or not named else VoiceLibrary()
    for line in named:
        try:
            line.voice = str(line.voice) if isinstance(line.voice, int) and not isinstance(line.voice, bool) \
                else line.voice
            if not isinstance(line.voice, str):
                raise ValueError(f"voice: expected a voice name, a seed or a speaker string, got {line.voice!r}")
            found = voice_params(line.voice, library, speaker_for_seed or _needs_the_model)
        except ValueError as exc:
            line.status, line.error = "error", str(exc)
            continue
        line.voice, line.speaker = line.voice.strip(), found["spk_emb"]
        if found["spk_emb"] is not None:
            _check_speaker(found["spk_emb"], plan.speakers)
        if found["spk_smp"] is not None:
            plan.voice_clips[line.voice] = {"spk_smp": found["spk_smp"], "txt_smp": found["txt_smp"]}


def _needs_the_model(seed: int) -> str:
    raise ValueError("voice: presets and seeds are drawn by the model: plan_export(speaker_for_seed=...) was not "
                     "given one")


def _reject_duplicates(lines: list[ExportLine]) -> None:
    owner: dict[str, int] = {}
    for line in lines:
        if line.output is None:
            continue
        key = line.output.casefold()  # a case-insensitive file system would merge these
        if key in owner:
            line.status = "error"
            line.error = f"output: {line.output} is already used by line {owner[key]}; give another id or output"
        owner.setdefault(key, line.line)


def _base_seeds(plan: ExportPlan, base: int | None) -> None:
    for line in plan.todo:
        if base is not None and line.seed is None:
            line.seed = _check_seed(base + line.line - 1, "seed + line number")


def _draw_seeds(plan: ExportPlan) -> None:
    draw = random.SystemRandom()
    for line in plan.todo:
        if line.seed is None:
            line.seed = draw.randrange(2**31)
