"""Batch export on this machine: an ExportPlan's pending lines -> the runner, shard by shard -> WAVs, manifest.json.

`store` is the one place a finished line reaches the output folder, here and for the Ray export's driver.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from ..chat import Chat, pipeline_of
from ..engine.progress import progress_bar
from ..params import InferCodeParams
from ..text.voices import VoiceLibrary
from .manifest import file_digest, now, replace_atomically
from .names import SIDECAR_SUFFIX
from .plan import ExportPlan, plan_export
from .runner import LineResult, Log, run_shard, shards_of
from .safe_files import check_inside

if TYPE_CHECKING:
    from ..speech import SpeechPipeline

CHUNK_SIZE = 256  # lines per job (shape "each"): bounds the prompts and finished audio held at once


def timestamps_path(wav_path: Path) -> Path:
    """Where a WAV's sentence timestamps go ([{"text", "start", "end"}], seconds): NAME.timestamps.json, a name no
    WAV's sidecar shares with manifest.json (resume.mark_finished looks for it there too)."""
    return wav_path.with_suffix(SIDECAR_SUFFIX)


def run_export(speech: SpeechPipeline | Chat | None, plan: ExportPlan, params: InferCodeParams | None = None,
               chunk_size: int = CHUNK_SIZE, progress: bool = True, log: Log = tqdm.write) -> ExportPlan:
    """Synthesise the pending lines (statuses updated in place) and write the manifest (once, as the run ends: each
    finished line goes to the journal as it lands). The output folder's lock is released at the end, also on an
    error or Ctrl-C.

    `params` is every line's template (spk_emb and manual_seed are set per line). `speech` (a loaded Chat or its
    pipeline) may be None when nothing is pending.
    """
    pipeline = None if speech is None else pipeline_of(speech)
    params = params or InferCodeParams(show_tqdm=False)
    report_plan(plan, log)
    if plan.todo and pipeline is None:
        plan.release()
        raise ValueError("speech: a loaded Chat or SpeechPipeline is needed, the plan has lines to synthesise")
    if pipeline is not None:
        plan.meta.update(model=str(pipeline.paths.root), precision=pipeline.dtype, started=now())
    shards = shards_of(plan, params, chunk_size)
    with progress_bar(len(plan.todo), "export", "line", enabled=progress and bool(shards), leave=True) as bar:
        def done(result: LineResult) -> None:
            store(plan, result, log)
            bar.update(1)

        try:
            for shard in shards:
                assert pipeline is not None  # shards hold the pending lines, and they need a pipeline (above)
                run_shard(pipeline, shard, done, log)
        finally:
            plan.save()  # also on Ctrl-C, so the finished lines are on record
            plan.release()
    report_done(plan, log)
    return plan


def store(plan: ExportPlan, result: LineResult, log: Log) -> None:
    """A finished line into the output folder: its files (atomically), its status, digest and journal entry."""
    line = plan.lines[result.key]
    if result.error is not None:
        return fail(plan, result.key, result.error, log)
    path, wav, stamps, cues = plan.out_dir / line.file, result.wav, result.timestamps, result.captions
    try:
        check_inside(plan.out_dir, path)  # a folder on the way swapped for a link since the plan: never followed
        replace_atomically(path, lambda tmp: tmp.write_bytes(wav))
        if stamps is not None:
            replace_atomically(timestamps_path(path), lambda tmp: tmp.write_bytes(stamps))
        if cues is not None and plan.captions is not None:  # NAME.srt / NAME.vtt beside NAME.wav
            replace_atomically(path.with_suffix(f".{plan.captions}"), lambda tmp: tmp.write_bytes(cues))
    except Exception as exc:  # noqa: BLE001 - a full disk or a blocked path fails this line only
        return fail(plan, result.key, f"could not write {line.output}: {exc}", log)
    line.status, line.error, line.duration = "ok", None, result.seconds
    line.audio = file_digest(path)
    try:
        plan.journal(line)
    except (OSError, ValueError) as exc:  # a journal swapped for a link or a FIFO: never written through
        log(f"line {line.line}: not journalled ({exc}); the manifest records it when the run ends")
    log(f"{path}  {line.duration:.2f} s")


def fail(plan: ExportPlan, key: int, message: str, log: Log) -> None:
    line = plan.lines[key]
    line.status, line.error = "error", message
    log(f"line {line.line}: {message}")


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


def export(speech: SpeechPipeline | Chat, input_path: str | Path, out_dir: str | Path, seed: int | None = None,
           speaker: str | None = None, params: InferCodeParams | None = None, progress: bool = True,
           log: Log = tqdm.write, voice: str | None = None, voices: VoiceLibrary | None = None) -> ExportPlan:
    """plan_export + run_export: every line of `input_path` to a WAV in `out_dir`, resuming earlier runs."""
    plan = plan_export(input_path, out_dir, seed, speaker, params, voice, voices,
                       speaker_for_seed=lambda seed: pipeline_of(speech).speakers.random(seed=seed))
    return run_export(speech, plan, params, progress=progress, log=log)
