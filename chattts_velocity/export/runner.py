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
from ..audio.captions import captions
from ..audio.loudness import normalize_loudness
from ..audio.wav import SAMPLE_RATE
from ..params import InferCodeParams
from ..speech.job import SynthesisJob
from ..speech.script_audio import join_script, turn_params
from ..text.script import Script, parse_script
from .plan import ExportPlan

if TYPE_CHECKING:
    from ..speech import SpeechPipeline

NO_AUDIO = "the model produced no audio (it stopped at the first step); try another seed"
Log = Callable[[str], None]


@dataclass(frozen=True)
class ShardLine:
    """One line of a shard, as its synthesis takes it (the plan's ExportLine is the line's record)."""

    key: int  # the line's index in plan.lines
    text: str
    params: InferCodeParams  # the run's template with this line's speaker, seed and cloned clip
    script: Script | None = None  # a line with [voice: ...] / [pause: ...] tags: its turns
    turns: tuple[InferCodeParams, ...] = ()  # a script's params, one per turn

    def texts(self) -> list[str]:
        return [self.text] if self.script is None else self.script.texts

    def params_list(self) -> list[InferCodeParams]:
        return [self.params] if self.script is None else list(self.turns)


@dataclass(frozen=True)
class Shard:
    """Lines synthesised together (one job of shape "each": Synthesis.each()) and what every WAV of the run gets."""

    lines: list[ShardLine]
    timestamps: bool = False  # also make each WAV's sentence spans
    loudness: float | None = None  # LUFS target, or None: as generated
    captions: str | None = None  # also make each WAV's caption file: "srt" or "vtt"


@dataclass
class LineResult:
    """What one line became: its files' bytes, or the error that stopped it."""

    key: int
    error: str | None = None
    wav: bytes = field(default=b"", repr=False)  # the complete WAV file
    timestamps: bytes | None = field(default=None, repr=False)  # NAME.timestamps.json, when the shard asks for it
    captions: bytes | None = field(default=None, repr=False)  # NAME.srt / NAME.vtt, when the shard asks for it
    seconds: float = 0.0  # length of the audio


def shards_of(plan: ExportPlan, params: InferCodeParams, size: int) -> list[Shard]:
    """The plan's pending lines, in order, as shards of at most `size` lines."""
    lines = [shard_line(plan, key, dataclasses.replace(params, spk_emb=line.speaker, manual_seed=line.seed,
                                                     **plan.clip_params(line)))
             for key, line in enumerate(plan.lines) if line.status == "pending"]
    return [Shard(lines[start : start + size], plan.timestamps, plan.loudness, plan.captions)
            for start in range(0, len(lines), size)]


def shard_line(plan: ExportPlan, key: int, params: InferCodeParams) -> ShardLine:
    """A pending line as its shard takes it; a script's turn voices were resolved by plan_export (plan.turn_voices)."""
    text = plan.lines[key].text
    script = parse_script(text, SAMPLE_RATE, "text")
    if script is None:
        return ShardLine(key, text, params)
    return ShardLine(key, text, params, script, tuple(turn_params(script, params, plan.turn_voices.__getitem__)))


def run_shard(pipeline: SpeechPipeline, shard: Shard, done: Callable[[LineResult], None], log: Log) -> None:
    """Synthesise every line of the shard; done() gets each line's result as it finishes (in any order).

    If the batch itself fails, its unfinished lines retry in halves until the culprit runs alone.
    """
    finished: set[int] = set()

    def finish(result: LineResult) -> None:
        finished.add(result.key)
        done(result)

    try:
        lines = shard.lines
        owner = [k for k, line in enumerate(lines) for _ in line.texts()]  # flat text -> its line
        first = {k: owner.index(k) for k in range(len(lines))}
        turns: dict[int, dict[int, np.ndarray | Spoken]] = {k: {} for k in range(len(lines))}
        timestamps = shard.timestamps or shard.captions is not None or any(line.script for line in lines)
        job = SynthesisJob([text for line in lines for text in line.texts()],
                           [p for line in lines for p in line.params_list()], timestamps=timestamps, shape="each")
        for i, result in pipeline.synthesis(job).each():
            k = owner[i]
            if lines[k].key in finished:
                continue  # another turn of this line failed already
            if isinstance(result, Exception):
                finish(LineResult(lines[k].key, error=f"synthesis failed: {type(result).__name__}: {result}"))
                continue
            turns[k][i - first[k]] = result
            if len(turns[k]) == len(lines[k].texts()):
                finish(encode(lines[k].key, _joined(lines[k], turns[k], result), shard))
    except Exception as exc:  # noqa: BLE001 - one line's failure must not cost the others
        rest = [line for line in shard.lines if line.key not in finished]
        if len(shard.lines) == 1:
            for line in rest:  # alone and still failing: this line is the culprit
                finish(LineResult(line.key, error=f"synthesis failed: {type(exc).__name__}: {exc}"))
            return
        log(f"a batch of {len(shard.lines)} lines failed ({type(exc).__name__}: {exc}); retrying {len(rest)} in "
            "halves")
        half = (len(rest) + 1) // 2
        for part in (rest[:half], rest[half:]):
            if part:
                run_shard(pipeline, dataclasses.replace(shard, lines=part), finish, log)


def _joined(line: ShardLine, turns: dict[int, np.ndarray | Spoken], last: np.ndarray | Spoken) -> np.ndarray | Spoken:
    """A line's audio: its one text's result, or its script's turns joined with their pauses."""
    if line.script is None:
        return last
    spoken = [turns[t] for t in range(len(line.script.turns))]
    if not all(isinstance(s, Spoken) for s in spoken):
        raise RuntimeError("run_shard: a script's turns came without their timestamps")
    return join_script(line.script, [s for s in spoken if isinstance(s, Spoken)])


def encode(key: int, result: np.ndarray | Spoken, shard: Shard) -> LineResult:
    """One line's audio -> its WAV bytes (normalised to the shard's loudness) and, for a Spoken, the timestamps' and
    captions' bytes the shard asks for."""
    wav = result.wav if isinstance(result, Spoken) else result
    if len(wav) == 0:
        return LineResult(key, error=NO_AUDIO)
    if shard.loudness is not None:
        wav = normalize_loudness(wav, shard.loudness)  # a gain only: the length and the timestamps hold
    stamps = cues = None
    if isinstance(result, Spoken) and shard.timestamps:
        spans = [stamp.as_dict() for stamp in result.timestamps]
        stamps = json.dumps(spans, ensure_ascii=False, indent=1).encode("utf-8")
    if isinstance(result, Spoken) and shard.captions is not None:
        cues = captions(result.timestamps, shard.captions).encode("utf-8")
    return LineResult(key, wav=wav_bytes(wav), timestamps=stamps, captions=cues,
                      seconds=round(len(wav) / SAMPLE_RATE, 3))
