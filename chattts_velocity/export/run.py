"""Batch export on this machine: an ExportPlan's pending lines -> Chat.infer_many -> WAVs and manifest.json."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm import tqdm

from ..audio import Spoken, write_wav
from ..audio.loudness import normalize_loudness
from ..audio.wav import SAMPLE_RATE
from ..engine.progress import Progress, progress_bar
from ..params import InferCodeParams
from ..text.voices import VoiceLibrary
from .manifest import now, replace_atomically
from .plan import ExportLine, ExportPlan, plan_export

if TYPE_CHECKING:
    from ..chat import Chat

CHUNK_SIZE = 256  # lines per infer_many call: bounds the prompts and finished audio held at once
Log = Callable[[str], None]


def timestamps_path(wav_path: Path) -> Path:
    """Where a WAV's sentence timestamps go ([{"text", "start", "end"}], seconds): NAME.timestamps.json, a name no
    WAV's sidecar shares with manifest.json."""
    return wav_path.with_suffix(".timestamps.json")


def run_export(chat: Chat | None, plan: ExportPlan, params: InferCodeParams | None = None,
               chunk_size: int = CHUNK_SIZE, progress: bool = True, log: Log = tqdm.write) -> ExportPlan:
    """Synthesise the pending lines (statuses updated in place) and write the manifest.

    `params` is every line's template (spk_emb and manual_seed are set per line). `chat` may be None
    when nothing is pending.
    """
    params = params or InferCodeParams(show_tqdm=False)
    report_plan(plan, log)
    if chat is not None:
        plan.meta.update(model=str(chat.paths.root), precision=chat.dtype, started=now())
    _check_speakers_fit(chat, plan, log)
    todo = plan.todo
    with progress_bar(len(todo), "export", "line", enabled=progress and bool(todo), leave=True) as bar:
        try:
            for start in range(0, len(todo), chunk_size):
                _run_chunk(chat, plan, todo[start : start + chunk_size], params, bar, log)
                plan.save()
        finally:
            plan.save()  # also on Ctrl-C, so the finished lines are on record
    report_done(plan, log)
    return plan


def report_plan(plan: ExportPlan, log: Log) -> None:
    for line in plan.lines:
        if line.status == "error":
            log(f"line {line.line}: {line.error}")
    if existing := sum(line.reason == "already exported" for line in plan.lines):
        log(f"skipped {existing} existing outputs in {plan.out_dir}")


def report_done(plan: ExportPlan, log: Log) -> None:
    existing = sum(line.reason == "already exported" for line in plan.lines)
    log(f"wrote {plan.count('ok')}, skipped {existing} existing, {plan.count('error')} failed; "
        f"manifest {plan.manifest}")
    log(f"{plan.succeeded}/{len(plan.texts)} succeeded")


def _check_speakers_fit(chat: Chat | None, plan: ExportPlan, log: Log) -> None:
    if not plan.todo:
        return
    if chat is None:
        raise ValueError("chat: a loaded Chat is needed, the plan has lines to synthesise")
    # A speaker vector lives in the GPT's hidden space; a wrong width would fail the whole batch.
    width = chat.config.hidden_size
    for line in plan.todo:
        got = plan.speaker_widths.get(line.speaker, width)
        if got != width:
            _fail(line, f"speaker: holds {got} values but this model expects {width}; use a speaker string "
                        "made with this model", log)


def _run_chunk(chat: Chat, plan: ExportPlan, chunk: list[ExportLine], params: InferCodeParams, bar: Progress,
               log: Log) -> None:
    """One engine batch; if it fails, its unfinished lines retry in halves until the culprit runs alone."""
    try:
        per_line = [dataclasses.replace(params, spk_emb=line.speaker, manual_seed=line.seed, **plan.clip_params(line))
                    for line in chunk]
        for i, result in chat.infer_many([line.text for line in chunk], per_line, timestamps=plan.timestamps):
            if isinstance(result, Exception):
                _fail(chunk[i], f"synthesis failed: {type(result).__name__}: {result}", log)
            else:
                _save(plan, chunk[i], result, log)
            bar.update(1)
    except Exception as exc:  # noqa: BLE001 - one line's failure must not cost the others
        rest = [line for line in chunk if line.status == "pending"]
        if len(chunk) == 1:
            for line in rest:  # alone and still failing: this line is the culprit
                _fail(line, f"synthesis failed: {type(exc).__name__}: {exc}", log)
                bar.update(1)
            return
        log(f"a batch of {len(chunk)} lines failed ({type(exc).__name__}: {exc}); retrying {len(rest)} in halves")
        half = (len(rest) + 1) // 2
        for part in (rest[:half], rest[half:]):
            if part:
                _run_chunk(chat, plan, part, params, bar, log)


def _save(plan: ExportPlan, line: ExportLine, result: np.ndarray | Spoken, log: Log) -> None:
    wav = result.wav if isinstance(result, Spoken) else result
    if len(wav) == 0:
        return _fail(line, "the model produced no audio (it stopped at the first step); try another seed", log)
    if plan.loudness is not None:
        wav = normalize_loudness(wav, plan.loudness)  # a gain only: the length and the timestamps hold
    try:
        replace_atomically(plan.out_dir / line.output, lambda tmp: write_wav(tmp, wav))
        if isinstance(result, Spoken):
            replace_atomically(timestamps_path(plan.out_dir / line.output), lambda tmp: tmp.write_text(
                json.dumps([stamp.as_dict() for stamp in result.timestamps], ensure_ascii=False, indent=1)))
    except Exception as exc:  # noqa: BLE001 - a full disk or a blocked path fails this line only
        return _fail(line, f"could not write {line.output}: {exc}", log)
    line.status, line.duration = "ok", round(len(wav) / SAMPLE_RATE, 3)
    plan.journal(line)
    log(f"{plan.out_dir / line.output}  {line.duration:.2f} s")


def _fail(line: ExportLine, message: str, log: Log) -> None:
    line.status, line.error = "error", message
    log(f"line {line.line}: {message}")


def export(chat: Chat, input_path: str | Path, out_dir: str | Path, seed: int | None = None,
           speaker: str | None = None, params: InferCodeParams | None = None, progress: bool = True,
           log: Log = tqdm.write, voice: str | None = None, voices: VoiceLibrary | None = None) -> ExportPlan:
    """plan_export + run_export: every line of `input_path` to a WAV in `out_dir`, resuming earlier runs."""
    plan = plan_export(input_path, out_dir, seed, speaker, params, voice, voices)
    return run_export(chat, plan, params, progress=progress, log=log)
