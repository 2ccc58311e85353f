"""benchmarks/bench_serve.py on tiny weights: a real server process and the engine alone, in one run; the JSON
holds both sides and their ratios (no speed asserted: only that everything was measured)."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import bench_serve  # noqa: E402 (imported once REPO is on sys.path)

pytestmark = pytest.mark.e2e


def test_bench_serve_measures_both_sides(tiny_assets, tmp_path) -> None:
    bench_serve.main(["--model", str(tiny_assets), "--sizes", "1,3", "--steps", "20", "--repeats", "1",
                      "--name", "smoke", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "serve_smoke.json").read_text(encoding="utf-8"))
    for side in ("server", "engine"):
        for n in ("1", "3"):
            run = report[side][n]
            assert run["audio_s_per_s"] > 0 and 0 < run["ttfa_mean"] <= run["ttfa_max"] <= run["wall_s"]
    for n in ("1", "3"):
        assert all(math.isfinite(v) and v > 0 for v in report["ratios"][n].values())
    # the same forced-length requests on both sides: equal audio per request, so equal totals per wall second * wall
    for n in ("1", "3"):
        server, engine = report["server"][n], report["engine"][n]
        assert server["audio_s_per_s"] * server["wall_s"] == pytest.approx(engine["audio_s_per_s"] * engine["wall_s"])
