"""`chattts-velocity export` as a user runs it: a subprocess on the tiny demo checkpoint, run twice."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from timing import Slowness

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO)]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-m", "chattts_velocity.cli", "export", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture()
def workdir(tmp_path: Path, tiny_assets: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder whose cache ($CHATTTS_VELOCITY_CACHE, inherited by the subprocess) holds the tiny checkpoint, so
    `--model demo --tiny` finds it instead of writing one."""
    monkeypatch.setenv("CHATTTS_VELOCITY_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "demo-tiny").symlink_to(tiny_assets, target_is_directory=True)
    return tmp_path


def test_export_fifty_lines_twice(workdir: Path) -> None:
    words = ("alpha bravo charlie delta echo " * 10).split()
    rows = [json.dumps({"text": f"Line {word} of the batch."}) for word in words]
    rows[9] = '{"text": '  # invalid JSON
    rows[19] = json.dumps({"text": "Outside.", "output": "../../outside.wav"})
    (workdir / "lines.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    args = ("lines.jsonl", "-o", "out", "--model", "demo", "--tiny", "--seed", "3", "--max-new-token", "8")

    first = cli(workdir, *args)
    assert first.returncode == 1, first.stderr[-2000:]
    assert first.stdout.rstrip().endswith("48/50 succeeded"), first.stdout[-2000:]
    assert "line 10: invalid JSON" in first.stdout and "line 20: output:" in first.stdout
    wavs = sorted((workdir / "out").glob("*.wav"))
    assert len(wavs) == 48 and not (workdir.parent / "outside.wav").exists()
    entries = json.loads((workdir / "out" / "manifest.json").read_text(encoding="utf-8"))["lines"]
    assert [e["seed"] for e in entries if e["status"] == "ok"] == [3 + k for k in range(50) if k not in (9, 19)]
    assert not (workdir / "out" / ".export.lock").exists()  # removed when the export ends
    assert "Line alpha" not in (workdir / "out" / "manifest.json").read_text(encoding="utf-8")  # digests, not text
    rate = re.search(r"export: 48/48 lines in [0-9.]+ s \((.+)\)", first.stderr)
    assert rate and re.fullmatch(r"[0-9.]+ lines/s|[0-9]+ s a line", rate.group(1)) and rate.group(1) != "0.0 lines/s"
    stamps = {p.name: p.stat().st_mtime_ns for p in wavs}

    second = cli(workdir, *args)
    assert second.returncode == 1, second.stderr[-2000:]
    assert "skipped 48 existing outputs" in second.stdout and "wrote 0, skipped 48 existing, 2 failed" in second.stdout
    assert second.stdout.rstrip().endswith("48/50 succeeded")
    assert {p.name: p.stat().st_mtime_ns for p in (workdir / "out").glob("*.wav")} == stamps
    assert not [p for p in (workdir / "out").rglob("*") if p.name.endswith(".tmp")]


LINE_CHECK_S = 10.0  # on the reference host: reading and refusing a 10 MB line, beyond the CLI's own start


def refuse_a_bad_speaker(workdir: Path) -> float:
    """The CLI refusing its --speaker argument (before it reads a line or loads a model); its seconds."""
    (workdir / "lines.txt").write_text("Hello.\n", encoding="utf-8")
    started = time.monotonic()
    result = cli(workdir, "lines.txt", "-o", "out", "--model", "demo", "--tiny", "--speaker", "nope")
    assert result.returncode != 0 and "error: speaker" in result.stderr and "Traceback" not in result.stderr
    return time.monotonic() - started


def test_a_one_line_10_mb_input_is_refused_before_the_model_loads(workdir: Path) -> None:
    """No model loads ("loaded:" never printed), and the refusal takes at most LINE_CHECK_S (scaled by this host's
    slowness) longer than the same CLI refusing a bad argument, timed just before: normalising the line would take
    hours."""
    (workdir / "big.txt").write_text("x" * 10_000_000 + "\n", encoding="utf-8")
    slowness, start_only = Slowness(), refuse_a_bad_speaker(workdir)
    started = time.monotonic()
    result = cli(workdir, "big.txt", "-o", "out", "--model", "demo", "--tiny")
    took = time.monotonic() - started
    assert result.returncode == 1 and "line 1: text: 10000000 characters is over the limit" in result.stdout
    assert "loaded:" not in result.stdout + result.stderr and "Traceback" not in result.stderr
    assert not (workdir / "out" / ".export.lock").exists()
    slowness.sample()
    assert took < start_only + slowness.scaled(LINE_CHECK_S), (took, start_only, slowness)


def test_export_bad_speaker_argument_is_a_clear_error(workdir: Path) -> None:
    refuse_a_bad_speaker(workdir)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_export_ends_in_one_line_and_keeps_its_finished_lines(workdir: Path, signum: int) -> None:
    (workdir / "lines.txt").write_text("".join(f"Sentence number {k}.\n" for k in range(400)), encoding="utf-8")
    args = ["lines.txt", "-o", "out", "--model", "demo", "--tiny", "--seed", "1", "--max-new-token", "40"]
    path = os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(REPO)]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    proc = subprocess.Popen([sys.executable, "-m", "chattts_velocity.cli", "export", *args], cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not list((workdir / "out").glob("*.wav")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == "chattts-velocity export: interrupted" and "Traceback" not in err
    entries = json.loads((workdir / "out" / "manifest.json").read_text(encoding="utf-8"))["lines"]
    done = {e["output"] for e in entries if e["status"] == "ok"}
    assert done and done == {p.name for p in (workdir / "out").glob("*.wav")}  # every WAV on disk is on record
    assert not (workdir / "out" / ".export.lock").exists()
