"""benchmarks/bench_engine.py on tiny weights: runs end to end, and its numbers follow from what it timed."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_engine.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_engine", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_run_writes_consistent_json(bench, tiny_assets, tmp_path) -> None:
    bench.main(["--model", str(tiny_assets), "--quick", "--steps", "3", "--concurrency", "1,2", "--dtype",
                "float32", "--threads", "1", "--name", "smoke", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "smoke.json").read_text())
    runs = report["repeats"][0]["runs"]
    assert {(r["path"], r["concurrency"]) for r in runs} == {("velocity", 1), ("velocity", 2), ("plain", 1)}
    for r in runs:
        assert math.isclose(r["steps_per_s"], r["concurrency"] * 3 / r["gpt_seconds"])
        assert math.isclose(r["audio_per_s_gpt"], r["steps_per_s"] / 46.875)
        assert r["audio_per_s_e2e"] < r["audio_per_s_gpt"]  # decoding takes time
        assert len(r["ttft"]) == r["concurrency"] and all(0 < t <= r["gpt_seconds"] for t in r["ttft"])
    by = {(r["path"], r["concurrency"]): r for r in runs}
    expected = by[("velocity", 1)]["steps_per_s"] / by[("plain", 1)]["steps_per_s"]
    assert math.isclose(report["ratios"]["single stream vs plain@1"], expected)
    probe = report["repeats"][0]["probe_before"]
    assert probe["gflops_1_thread"] > 0 and probe["threads"] == 1


def test_bad_counts_are_clear_errors(bench) -> None:
    with pytest.raises(SystemExit, match="counts must be >= 1"):
        bench.main(["--concurrency", "0,4"])
    with pytest.raises(SystemExit, match="comma-separated integers"):
        bench.main(["--concurrency", "one"])

