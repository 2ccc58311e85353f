"""A first run says why it pauses: the CPU kernels' cold g++ build is announced before it starts, on stderr, with an
estimate of its time on this host (build_clock.py), a line per finished source, and its times recorded."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from chattts_velocity.model import kernels
from chattts_velocity.model.kernels import build_clock


@pytest.mark.skipif(kernels.unsupported() is not None, reason=f"CPU kernels unsupported here: {kernels.unsupported()}")
def test_a_cold_kernel_build_is_announced_before_it_runs(tmp_path: Path) -> None:
    env = {**os.environ, "CHATTTS_VELOCITY_CACHE": str(tmp_path), "CXX": "false"}  # a compiler that fails at once
    done = subprocess.run([sys.executable, "-c", "from chattts_velocity.model import kernels; print(kernels.load())"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=Path(__file__).parents[2])
    assert done.stdout.strip() == "False"  # the build failed, and load() said so without raising
    assert "note: building the CPU kernels (" in done.stderr and str(tmp_path / "kernels") in done.stderr


FAKE_CXX = """#!/bin/sh
# writes the file after -o, as a compiler would (empty: loading it fails)
while [ $# -gt 0 ]; do if [ "$1" = "-o" ]; then : > "$2"; fi; shift; done
"""


@pytest.mark.skipif(kernels.unsupported() is not None, reason=f"CPU kernels unsupported here: {kernels.unsupported()}")
def test_a_build_shows_its_progress_and_records_its_times(tmp_path: Path) -> None:
    cxx = tmp_path / "cxx"
    cxx.write_text(FAKE_CXX)
    cxx.chmod(0o755)
    env = {**os.environ, "CHATTTS_VELOCITY_CACHE": str(tmp_path), "CXX": str(cxx)}
    done = subprocess.run([sys.executable, "-c", "from chattts_velocity.model import kernels; print(kernels.load())"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=Path(__file__).parents[2])
    assert done.stdout.strip() == "False"  # the empty library does not load
    steps = len(kernels.DRIVERS) + len(kernels.ISAS[kernels.isa() or "avx2"].extra_sources) + 1
    lines = done.stderr.splitlines()
    notice = next(i for i, line in enumerate(lines) if "note: building the CPU kernels" in line)
    assert re.search(r"about \d+ s here \(this CPU's speed and load now;", lines[notice])
    progress = [line for line in lines if re.match(r"\s+\[\d+/\d+\] \S+", line)]
    assert progress[0].strip().startswith(f"[1/{steps}]")
    assert progress[-1].strip().startswith(f"[{steps}/{steps}] the link")
    record = json.loads((tmp_path / "kernels" / build_clock.RECORD).read_text())
    assert set(record["cpu_s"]) == {line.split()[1] for line in progress[:-1]}
    assert record["wall_s"] > 0 and record["model_s"] > 0
    assert any("note: the CPU kernels" in line and "built in" in line for line in lines[notice:])


@pytest.mark.parametrize("share,load", [(1.0, 0.0), (1.0, 5.0), (0.25, 9.0)])
def test_the_estimate_is_cpu_time_over_the_cores_the_build_gets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                share: float, load: float) -> None:
    """Four sources of 1 s at the reference speed on 2 cores: 2 s idle; on a busy host the probe's share of a core."""
    monkeypatch.setattr(build_clock, "REFERENCE", {"a.cpp": 1.0, "b.cpp": 1.0, "c.cpp": 1.0, "d.cpp": 1.0})
    monkeypatch.setattr(build_clock, "probe", lambda: build_clock.Probe(build_clock.REFERENCE_PROBE_S * 2, share))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    sources = ["a.cpp", "b.cpp", "c.cpp", "d.cpp"]  # twice the reference's CPU time each at half its speed
    got = build_clock.estimate(sources, tmp_path, 4)
    cores = 2 if load == 0 else 2 * 4 / (4 + load - 1)
    assert got.seconds == pytest.approx(8.0 / (share if share < 0.9 else min(4, cores)))
    build_clock.record(tmp_path, {}, wall_s=3 * got.seconds, guess=got)  # the build took 3x the model
    again = build_clock.estimate(sources, tmp_path, 4)
    assert again.model_s == pytest.approx(got.seconds) and again.seconds == pytest.approx(3 * got.seconds)
    assert "corrected by the last build here" in again.basis
