"""benchmarks/gpu_check.sh and gpu_check.py without a GPU: the script parses, the dry run writes every key on CPU."""
from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
KEPT = {"device", "steady_steps_per_s", "max_concurrent", "invariant_alone_vs_63", "stream64_audio_s_per_s", "ttfa_s"}


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_parses() -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash on this machine")
    done = subprocess.run([bash, "-n", str(BENCH / "gpu_check.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow  # several seconds: the default suite stays within its time
def test_the_dry_run_on_cpu_writes_every_key(tiny_assets, tmp_path) -> None:
    out = tmp_path / "gpu_check.json"
    _module("gpu_check").main(["--dry-run", "--model", str(tiny_assets), "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["errors"] == {}
    assert KEPT <= set(report) and report["device"].startswith("cpu") and report["mode"] == "dry-run"
    assert set(report["steady_steps_per_s"]) == {"1", "16", "64", "256"}
    assert all(v > 0 for v in report["steady_steps_per_s"].values())
    assert report["max_concurrent"] == 256  # 256 sequences ran in one step, not in waves
    assert isinstance(report["invariant_alone_vs_63"], bool)
    assert set(report["ttfa_s"]) == {"1", "64"} and report["stream64_audio_s_per_s"] > 0
    assert report["streams"]["64"]["complete"]  # every client got its whole clip
    for backend in ("new", "old"):
        assert {n: set(c) for n, c in report["replay_ms"][backend].items()} == {n: {"100", "500"}
                                                                                 for n in ("1", "16", "64")}
    assert set(report["kernels_per_step"]) == {"1", "64"} and report["kernels_per_step"]["1"] > 10
    assert "greedy_match_old" not in report  # removed: near-greedy codes diverge from the first bf16 near tie on
    shape = report["shape"]
    assert shape["prompt_positions"] == [4, 12] and shape["max_model_len"] > 12
    low, high = shape["context_positions"]
    assert 4 < low <= high  # the timed steps ran past the prompts
    assert report["cuda"] is None or isinstance(report["cuda"], str)
    assert set(report["gemm_hbm_fraction"]) == {"1", "64"} and set(report["gemm_tbs"]) == {"qkv", "o", "gate_up",
                                                                                             "down"}
    assert report["gemm_hbm_fraction"]["1"] == round(min(t["1"] for t in report["gemm_tbs"].values())
                                                     / report["bandwidth_tbs"], 4)
    assert isinstance(report["invariant_alone_vs_63_overlapped"], (bool, type(None)))
    assert report["overlapped_steps_per_s"] is None or set(report["overlapped_steps_per_s"]) == {"1", "16", "64",
                                                                                                 "256"}


def test_the_dry_run_never_writes_the_committed_results(tmp_path, monkeypatch) -> None:
    gpu_check = _module("gpu_check")
    seen = {}
    monkeypatch.setattr(gpu_check, "measure", lambda args, plan, report, save: seen.update(plan=plan))
    monkeypatch.setattr(gpu_check.tempfile, "gettempdir", lambda: str(tmp_path))
    committed = BENCH / "results" / "gpu_check.json"
    before = committed.read_bytes()
    gpu_check.main(["--dry-run", "--model", "unused"])
    assert committed.read_bytes() == before and (tmp_path / "gpu_check_dry_run.json").is_file()
    assert seen["plan"] is gpu_check.DRY


def test_a_part_past_its_time_limit_leaves_the_others_results(tmp_path) -> None:
    gpu_check = _module("gpu_check")
    report = {"errors": {}, "seconds": {}, "figure": {}}
    saved, cleaned = [], []

    def endless() -> None:
        report["figure"]["slow"] = "started"
        while True:
            time.sleep(0.01)

    gpu_check.timed_part(report, "quick", lambda: report["figure"].update(quick=1), 5, saved.append)
    gpu_check.timed_part(report, "slow", endless, 0.2, saved.append, lambda: cleaned.append(True))
    gpu_check.timed_part(report, "after", lambda: report["figure"].update(after=2), 5, saved.append)
    assert report["figure"] == {"quick": 1, "slow": "started", "after": 2}
    assert report["errors"] == {"slow": "PartTimeout: timed out after 0.2 s"} and cleaned == [True]
    assert set(report["seconds"]) == {"quick", "slow", "after"} and len(saved) == 3
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # no alarm left behind


def test_a_failing_part_records_its_error_and_cleans_up() -> None:
    gpu_check = _module("gpu_check")
    report = {"errors": {}, "seconds": {}}
    cleaned = []
    gpu_check.timed_part(report, "bad", lambda: 1 / 0, 5, lambda r: None, lambda: cleaned.append(True))
    assert report["errors"]["bad"].startswith("ZeroDivisionError") and cleaned == [True]


def test_a_run_cut_short_keeps_the_parts_it_finished(tmp_path, monkeypatch) -> None:
    gpu_check = _module("gpu_check")

    def first_part_then_killed(args, plan, report, save) -> None:
        report["steady_steps_per_s"]["1"] = 1.0
        save(report)
        raise TimeoutError("the time limit")

    monkeypatch.setattr(gpu_check, "measure", first_part_then_killed)
    out = tmp_path / "cut.json"
    with pytest.raises(TimeoutError):
        gpu_check.main(["--dry-run", "--model", "unused", "--out", str(out)])
    assert json.loads(out.read_text(encoding="utf-8"))["steady_steps_per_s"] == {"1": 1.0}
