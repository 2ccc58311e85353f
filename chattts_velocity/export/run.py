"""Batch export on this machine: an ExportPlan's pending lines -> Chat.infer_many -> WAVs and manifest.json."""
from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from tqdm.auto import tqdm

from ..audio import write_wav
from ..audio.wav import SAMPLE_RATE
from ..params import InferCodeParams
from .plan import MANIFEST, ExportLine, ExportPlan, plan_export

if TYPE_CHECKING:
    from ..chat import Chat

CHUNK_SIZE = 256  # lines per infer_many call: bounds the prompts and finished audio held at once
Log = Callable[[str], None]


def run_export(chat: Chat | None, plan: ExportPlan, params: InferCodeParams | None = None,
               chunk_size: int = CHUNK_SIZE, progress: bool = True, log: Log = tqdm.write) -> ExportPlan:
    """Synthesise the pending lines (statuses updated in place) and write the manifest.

    `params` is every line's template (spk_emb and manual_seed are set per line). `chat` may be None
    when nothing is pending.
    """
    params = params or InferCodeParams(show_tqdm=False)
    for line in plan.lines:
        if line.status == "error":
            log(f"line {line.line}: {line.error}")
    if plan.count("skipped"):
        log(f"skipped {plan.count('skipped')} existing outputs in {plan.out_dir}")
    _check_speakers_fit(chat, plan, log)
    todo = plan.todo
    with tqdm(total=len(todo), unit="line", desc="export", disable=not (progress and todo)) as bar:
        try:
            for start in range(0, len(todo), chunk_size):
                _run_chunk(chat, plan, todo[start : start + chunk_size], params, bar, log)
                write_manifest(plan)
        finally:
            write_manifest(plan)  # also on Ctrl-C, so the finished lines are on record
    log(f"wrote {plan.count('ok')}, skipped {plan.count('skipped')} existing, {plan.count('error')} failed; "
        f"manifest {plan.manifest}")
    log(f"{plan.succeeded}/{len(plan.lines)} succeeded")
    return plan


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


def _run_chunk(chat: Chat, plan: ExportPlan, chunk: list[ExportLine], params: InferCodeParams, bar: tqdm,
               log: Log) -> None:
    """One engine batch; if it fails, its unfinished lines retry in halves until the culprit runs alone."""
    try:
        per_line = [dataclasses.replace(params, spk_emb=line.speaker, manual_seed=line.seed) for line in chunk]
        for i, result in chat.infer_many([line.text for line in chunk], per_line):
            if isinstance(result, Exception):
                _fail(chunk[i], f"synthesis failed: {type(result).__name__}: {result}", log)
            else:
                _save(plan.out_dir, chunk[i], result, log)
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


def _save(out_dir: Path, line: ExportLine, wav: np.ndarray, log: Log) -> None:
    if len(wav) == 0:
        return _fail(line, "the model produced no audio (it stopped at the first step); try another seed", log)
    try:
        replace_atomically(out_dir / line.output, lambda tmp: write_wav(tmp, wav))
    except Exception as exc:  # noqa: BLE001 - a full disk or a blocked path fails this line only
        return _fail(line, f"could not write {line.output}: {exc}", log)
    line.status, line.duration = "ok", round(len(wav) / SAMPLE_RATE, 3)
    log(f"{out_dir / line.output}  {line.duration:.2f} s")


def _fail(line: ExportLine, message: str, log: Log) -> None:
    line.status, line.error = "error", message
    log(f"line {line.line}: {message}")


def replace_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """write() a hidden temp file, fsync, rename: a crash never leaves a partial file under `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        with open(tmp, "r+b") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_manifest(plan: ExportPlan) -> Path:
    doc = {"input": plan.input, "output_dir": str(plan.out_dir), "total": len(plan.lines),
           "succeeded": plan.succeeded, "failed": plan.count("error"),
           "lines": [dataclasses.asdict(line) for line in plan.lines]}
    body = json.dumps(doc, ensure_ascii=False, indent=1)
    replace_atomically(plan.manifest, lambda tmp: tmp.write_text(body, encoding="utf-8"))
    return plan.manifest


def export(chat: Chat, input_path: str | Path, out_dir: str | Path, seed: int | None = None,
           speaker: str | None = None, params: InferCodeParams | None = None, progress: bool = True,
           log: Log = tqdm.write) -> ExportPlan:
    """plan_export + run_export: every line of `input_path` to a WAV in `out_dir`, resuming earlier runs."""
    return run_export(chat, plan_export(input_path, out_dir, seed, speaker), params, progress=progress, log=log)
