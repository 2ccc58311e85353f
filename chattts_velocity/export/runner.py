"""Batch export, the one runner: a shard of a plan's pending lines -> the speech pipeline -> each line's files.

The local export runs it on every pending line, shard by shard; the Ray export runs it per shard on each actor.
A result carries the files as bytes (the WAV, its timestamps sidecar), so whoever holds the output folder writes
them (run.store); the same shard therefore makes the same bytes on this machine and on an actor.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..audio import Spoken, wav_bytes
from ..audio.loudness import normalize_loudness
from ..audio.wav import SAMPLE_RATE
from ..params import InferCodeParams
from ..speech.job import SynthesisJob
from .plan import ExportPlan

if TYPE_CHECKING:
    from ..speech import SpeechPipeline

NO_AUDIO = "the model produced no audio (it stopped at the first step); try another seed"
Log = Callable[[str], None]


@dataclass(frozen=True)
class LineJob:
    key: int  # the line's index in plan.lines
    text: str
    params: InferCodeParams  # the run's template with this line's speaker, seed and cloned clip


@dataclass(frozen=True)
class Shard:
    """Lines synthesised together (one SpeechPipeline.run_each call) and what every WAV of the run gets."""

    jobs: list[LineJob]
    timestamps: bool = False  # also make each WAV's sentence spans
    loudness: float | None = None  # LUFS target, or None: as generated


@dataclass
class LineResult:
    """What one line became: its files' bytes, or the error that stopped it."""

    key: int
    error: str | None = None
    wav: bytes = field(default=b"", repr=False)  # the complete WAV file
    timestamps: bytes | None = field(default=None, repr=False)  # NAME.timestamps.json, when the shard asks for it
    seconds: float = 0.0  # length of the audio


def shards_of(plan: ExportPlan, params: InferCodeParams, size: int) -> list[Shard]:
    """The plan's pending lines, in order, as shards of at most `size` lines."""
    jobs = [LineJob(key, line.text, dataclasses.replace(params, spk_emb=line.speaker, manual_seed=line.seed,
                                                        **plan.clip_params(line)))
            for key, line in enumerate(plan.lines) if line.status == "pending"]
    return [Shard(jobs[start : start + size], plan.timestamps, plan.loudness) for start in range(0, len(jobs), size)]


def run_shard(pipeline: SpeechPipeline, shard: Shard, done: Callable[[LineResult], None], log: Log) -> None:
    """Synthesise every line of the shard; done() gets each line's result as it finishes (in any order).

    If the batch itself fails, its unfinished lines retry in halves until the culprit runs alone.
    """
    finished: set[int] = set()

    def finish(result: LineResult) -> None:
        finished.add(result.key)
        done(result)

    try:
        jobs = shard.jobs
        synthesis = SynthesisJob([job.text for job in jobs], [job.params for job in jobs],
                                 timestamps=shard.timestamps)
        for i, result in pipeline.run_each(synthesis):
            if isinstance(result, Exception):
                finish(LineResult(jobs[i].key, error=f"synthesis failed: {type(result).__name__}: {result}"))
            else:
                finish(encode(jobs[i].key, result, shard.loudness))
    except Exception as exc:  # noqa: BLE001 - one line's failure must not cost the others
        rest = [job for job in shard.jobs if job.key not in finished]
        if len(shard.jobs) == 1:
            for job in rest:  # alone and still failing: this line is the culprit
                finish(LineResult(job.key, error=f"synthesis failed: {type(exc).__name__}: {exc}"))
            return
        log(f"a batch of {len(shard.jobs)} lines failed ({type(exc).__name__}: {exc}); retrying {len(rest)} in halves")
        half = (len(rest) + 1) // 2
        for part in (rest[:half], rest[half:]):
            if part:
                run_shard(pipeline, dataclasses.replace(shard, jobs=part), finish, log)


def encode(key: int, result: np.ndarray | Spoken, loudness: float | None) -> LineResult:
    """One line's audio -> its WAV bytes (normalised to `loudness`) and, for a Spoken, its timestamps' bytes."""
    wav = result.wav if isinstance(result, Spoken) else result
    if len(wav) == 0:
        return LineResult(key, error=NO_AUDIO)
    if loudness is not None:
        wav = normalize_loudness(wav, loudness)  # a gain only: the length and the timestamps hold
    stamps = None
    if isinstance(result, Spoken):
        spans = [stamp.as_dict() for stamp in result.timestamps]
        stamps = json.dumps(spans, ensure_ascii=False, indent=1).encode("utf-8")
    return LineResult(key, wav=wav_bytes(wav), timestamps=stamps, seconds=round(len(wav) / SAMPLE_RATE, 3))
