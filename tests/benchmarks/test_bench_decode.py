"""benchmarks/bench_decode.py: the variants alternate turn by turn, and both levers write the JSON the docs read."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_decode

REPO = Path(__file__).resolve().parents[2]


def test_every_variant_takes_a_warm_up_turn_then_one_per_round() -> None:
    order: list[str] = []
    switched: list[str] = []
    turns = {name: (lambda name=name: order.append(name)) for name in ("a", "b")}
    ms = bench_decode.alternate(turns, 3, switched.append)
    assert order == ["a", "b"] * 4 and switched == order  # one warm-up round, then 3 timed ones
    assert {name: len(times) for name, times in ms.items()} == {"a": 3, "b": 3}
    assert all(t >= 0 for times in ms.values() for t in times)


def test_the_kv_summary_is_bf16_time_over_int8_time() -> None:
    summary = bench_decode.kv_summary({"auto": [30.0, 10.0, 20.0], "int8": [10.0, 5.0, 40.0]})
    assert summary["ms_per_step_median"] == {"auto": 20.0, "int8": 10.0}
    assert summary["int8_speedup"] == pytest.approx(2.0) and summary["steps_per_s_median"]["int8"] == 100.0


def _needs_cpu_kernels() -> None:
    from chattts_velocity.model import kernels

    if kernels.unsupported() is not None:
        pytest.skip(f"CPU kernels unsupported here: {kernels.unsupported()}")


@pytest.mark.slow
def test_backends_smoke_run(full_assets, tmp_path) -> None:
    _needs_cpu_kernels()
    bench_decode.main(["backends", "--model", str(full_assets), "--batches", "2", "--rounds", "1", "--warm-steps",
                       "2", "--name", "ab", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "ab.json").read_text())
    (result,) = report["batches"].values()
    times = result["ms_per_step_median"]
    assert "compiled, no AMX" in times and all(t > 0 for t in times.values())
    (ratios,) = [v for k, v in result.items() if k.startswith("speedup_vs_")]
    assert ratios["compiled, no AMX"] == 1.0 and set(ratios) == set(times)


@pytest.mark.slow
def test_kv_smoke_run(full_assets, tmp_path) -> None:
    _needs_cpu_kernels()
    bench_decode.main(["kv", "--model", str(full_assets), "--seqs", "2", "--context", "20", "--rounds", "1",
                       "--threads", "1", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "kv_int8.json").read_text())
    cell = report["threads"]["1"]
    assert set(cell["ms_per_step_median"]) == {"auto", "int8"} and cell["int8_speedup"] > 0
    assert report["seqs"] == 2 and report["context"] == 20 and len(cell["ms_per_step"]["int8"]) == 1
