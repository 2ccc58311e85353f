"""benchmarks/lib/stream.py on tiny weights: every request streams audio, TTFA is a real mid-stream time, and
the streamed clip matches the whole-clip decode (exact options) or visibly does not (a too-short lookahead)."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from benchmarks.lib.runs import load_suite
from benchmarks.lib.stream import run_stream_ttfa, summarise
from chattts_velocity.speech import StreamOptions

REPO = Path(__file__).resolve().parents[2]

STEPS = 60  # tiny exact first audio needs 24 + 13 steps: 60 leaves room for chunks before the end
HOP = 256


@pytest.fixture(scope="module")
def suite(tiny_assets):
    args = argparse.Namespace(model=str(tiny_assets), dtype="float32", compile_on=False, plain_list=[],
                              no_e2e=False, decode_dtype="float32", steps=STEPS)
    return load_suite(args)


def test_exact_stream_ttfa_and_accuracy(suite) -> None:
    run = run_stream_ttfa(suite, 2, StreamOptions(), "exact")
    assert run.concurrency == 2 and len(run.ttfa) == 2
    assert run.samples == [(2 * STEPS - 1) * HOP] * 2  # every request got its whole clip
    assert all(0 < t < run.wall_seconds for t in run.ttfa)  # first audio before the run ended...
    assert run.first_at_end == 0  # ...and before each request's own last step
    assert run.ttfa_mean <= run.ttfa_max <= run.wall_seconds
    assert math.isclose(run.ttfa_mean, sum(run.ttfa) / 2)
    assert run.max_abs_diff <= 1e-4


def test_short_lookahead_error_is_measured(suite) -> None:
    run = run_stream_ttfa(suite, 2, StreamOptions(first_chunk_steps=2, first_lookahead_steps=1), "rough")
    assert run.samples == [(2 * STEPS - 1) * HOP] * 2
    assert run.max_abs_diff > 1e-4  # a 1-step lookahead cuts the receptive field: the join must show
    assert run.options["first_lookahead_steps"] == 1


def test_short_clip_reports_first_audio_at_its_end(suite) -> None:
    suite_steps, suite.steps = suite.steps, 10  # below first chunk + lookahead (37 steps)
    try:
        run = run_stream_ttfa(suite, 1, StreamOptions(), "exact")
    finally:
        suite.steps = suite_steps
    assert run.first_at_end == 1 and run.samples == [(2 * 10 - 1) * HOP]


def test_summary_verdict_follows_targets() -> None:
    fast = {"label": "x", "concurrency": 1, "options": {}, "ttfa_mean": 0.1, "ttfa_median": 0.1, "ttfa_max": 0.4,
            "wall_seconds": 1.0, "max_abs_diff": 0.0, "first_at_end": 0}
    slow = {**fast, "concurrency": 16, "ttfa_max": 1.6}
    rows = summarise([{"stream_ttfa": [fast, slow]}, {"stream_ttfa": [{**fast, "ttfa_max": 0.6}]}])
    assert [(r["concurrency"], r["verdict"]) for r in rows] == [(1, "met"), (16, "MISSED")]
    assert rows[0]["ttfa_max"] == pytest.approx(0.5)  # median of 0.4 and 0.6 over the two repeats
