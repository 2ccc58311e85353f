"""Benchmark: streaming time to first audio (TTFA), velocity engine -> StreamSet chunks, as `serve` streams them.

The same forced-length requests as run_velocity. This thread steps the engine and pushes each step's hidden rows
into a StreamSet (Decoder + Vocos in float32, like the server and Chat.infer(stream=True)), so a request's TTFA
is submission -> its first non-empty chunk, first-chunk decode included. The streamed clip is then compared
with the whole-clip decode of the same hidden states: the accuracy cost of each StreamOptions.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from chattts_velocity.audio import decode_hidden_batch
from chattts_velocity.precision import Precision
from chattts_velocity.schema import GenerationOutput
from chattts_velocity.speech import EMPTY, DecoderSource, MelSource, StreamOptions, StreamSet

if TYPE_CHECKING:
    from benchmarks.lib.runs import Suite

OPTION_SETS = {  # at most 3: each one runs at every --ttfa-sizes count in every repeat
    "exact": StreamOptions(first_chunk_steps=None, first_lookahead_steps=None),
    "first 8, lookahead 16": StreamOptions(first_chunk_steps=8, first_lookahead_steps=16),
    "first 4, lookahead 12": StreamOptions(first_chunk_steps=4, first_lookahead_steps=12),
}
TARGETS = {1: 0.5, 16: 1.5}  # seconds to first audio alone / for every one of 16 concurrent requests


@dataclass
class StreamRun:
    label: str
    options: dict  # the StreamOptions fields
    concurrency: int
    steps: int  # forced code steps per request
    wall_seconds: float  # submission -> the last request's last chunk
    ttfa: list[float]  # seconds from submission to each request's first non-empty chunk
    samples: list[int]  # streamed samples per request
    max_abs_diff: float  # streamed vs whole-clip decode of the same hidden, worst request (inf: lengths differ)
    first_at_end: int = 0  # requests whose first audio came only with their last step (clip shorter than 1st chunk)

    @property
    def ttfa_mean(self) -> float:
        return statistics.fmean(self.ttfa)

    @property
    def ttfa_median(self) -> float:
        return statistics.median(self.ttfa)

    @property
    def ttfa_max(self) -> float:
        return max(self.ttfa)

    def as_dict(self) -> dict:
        return {**asdict(self), **{p: getattr(self, p) for p in ("ttfa_mean", "ttfa_median", "ttfa_max")}}

    def line(self) -> str:
        at_end = f" ({self.first_at_end} only at their end)" if self.first_at_end else ""
        return (f"  stream    N={self.concurrency:<3} {self.label:<22} TTFA mean {self.ttfa_mean:.2f} s, "
                f"max {self.ttfa_max:.2f} s{at_end}, wall {self.wall_seconds:.2f} s, "
                f"max |diff| {self.max_abs_diff:.1e}")


def run_stream_ttfa(suite: Suite, n: int, options: StreamOptions, label: str = "") -> StreamRun:
    """n requests at once; returns each one's time to first streamed audio and the streamed clip's error."""
    engine, prompts, params = suite.llm.engine, suite.prompts(n), suite.params()
    audio_dtype = "bfloat16" if suite.decode_dtype == torch.bfloat16 else "float32"
    mel = DecoderSource(suite.decoder, suite.vocos, Precision.decide(device=suite.device, decode_dtype=audio_dtype))
    streams = StreamSet(options)
    for k in range(n):
        streams.open(k, mel)
    chunks: list[list[np.ndarray]] = [[] for _ in range(n)]
    hidden: list[list[torch.Tensor]] = [[] for _ in range(n)]
    first: dict[int, float] = {}
    at_end = 0
    start = time.perf_counter()
    index = {engine.add_request(None, p, params): k for k, p in enumerate(prompts)}
    try:
        while engine.has_unfinished_requests():
            deltas = [(index[d.request_id], d) for d in engine.step()]
            out = _push(streams, mel, deltas)
            now = time.perf_counter() - start
            ended = {k for k, d in deltas if d.finished}
            for k, chunk in out.items():
                if len(chunk):
                    at_end += k not in first and k in ended
                    first.setdefault(k, now)
                    chunks[k].append(chunk)
            for k, d in deltas:
                if d.hidden is not None and len(d.token_ids):
                    hidden[k].append(d.hidden)
    finally:
        for rid in index:  # False for finished ones; frees the rest if a step raised
            engine.abort_request(rid)
    wall = time.perf_counter() - start
    streamed = [np.concatenate(c) if c else EMPTY for c in chunks]
    return StreamRun(label, asdict(options), n, suite.steps, wall, [first.get(k, float("nan")) for k in range(n)],
                     [len(s) for s in streamed], _max_abs_diff(suite, streamed, hidden), at_end)


def _push(streams: StreamSet, mel: MelSource, deltas: list[tuple[int, GenerationOutput]]) -> dict[int, np.ndarray]:
    """One engine step into the StreamSet, as speech.stream_texts does; returns the new samples per request."""
    with torch.inference_mode():
        out = streams.push({k: mel.rows(d) for k, d in deltas if len(d.token_ids)})
        ended = [k for k, d in deltas if d.finished]
        for k, chunk in streams.finish(ended).items():
            out[k] = np.concatenate([out.get(k, EMPTY), chunk])
    return out


def _max_abs_diff(suite: Suite, streamed: list[np.ndarray], hidden: list[list[torch.Tensor]]) -> float:
    whole = decode_hidden_batch(suite.decoder, suite.vocos, [torch.cat(h) for h in hidden])  # float32
    if any(len(s) != len(w) for s, w in zip(streamed, whole, strict=True)):
        return float("inf")
    return max(float(np.abs(s - w).max(initial=0.0)) for s, w in zip(streamed, whole, strict=True))


def run_sizes(suite: Suite, sizes: list[int]) -> list[dict]:
    """Every option set at every size (one repeat's "stream_ttfa"); [] without Decoder+Vocos (--no-e2e)."""
    if not sizes:
        return []
    if suite.decoder is None:
        print("  stream TTFA: skipped (--no-e2e loads no Decoder/Vocos)")
        return []
    runs = []
    for n in sizes:
        for label, options in OPTION_SETS.items():
            runs.append(run_stream_ttfa(suite, n, options, label))
            print(runs[-1].line(), flush=True)
    return [r.as_dict() for r in runs]


def summarise(repeats: list[dict]) -> list[dict]:
    """Median over repeats per (option set, N), worst accuracy, and the verdict against TARGETS; prints the table."""
    runs = [r for rep in repeats for r in rep.get("stream_ttfa", [])]
    if not runs:
        return []
    keys = list(dict.fromkeys((r["label"], r["concurrency"]) for r in runs))
    print("\nstreaming time to first audio (float32 StreamSet decode; median over repeats; target: "
          "every request):")
    print(f"{'option set':<24}{'N':>4}{'TTFA mean':>11}{'median':>9}{'max':>8}{'wall s':>9}{'max |diff|':>12}"
          f"  target")
    rows = []
    for label, n in sorted(keys, key=lambda key: (key[1], keys.index(key))):
        mine = [r for r in runs if (r["label"], r["concurrency"]) == (label, n)]
        row = {"label": label, "concurrency": n, "options": mine[0]["options"], "repeats": len(mine),
               **{k: statistics.median(r[k] for r in mine) for k in ("ttfa_mean", "ttfa_median", "ttfa_max",
                                                                      "wall_seconds")},
               "max_abs_diff": max(r["max_abs_diff"] for r in mine), "target_s": TARGETS.get(n),
               "first_at_end": max(r["first_at_end"] for r in mine)}
        row["verdict"] = None if row["target_s"] is None else ("met" if row["ttfa_max"] <= row["target_s"]
                                                               else "MISSED")
        rows.append(row)
        target = "" if row["verdict"] is None else f"{row['target_s']:.1f} s: {row['verdict']}"
        target += " (first audio at clip end: --steps < first chunk + lookahead)" if row["first_at_end"] else ""
        print(f"{label:<24}{n:>4}{row['ttfa_mean']:>11.2f}{row['ttfa_median']:>9.2f}{row['ttfa_max']:>8.2f}"
              f"{row['wall_seconds']:>9.2f}{row['max_abs_diff']:>12.1e}  {target}")
    return rows
