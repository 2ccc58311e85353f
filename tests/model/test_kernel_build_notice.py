"""A first run says why it pauses: the CPU kernels' cold g++ build (about 25 s on 2 cores) is announced
before it starts, on stderr."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from chattts_velocity.model import kernels


@pytest.mark.skipif(kernels.unsupported() is not None, reason=f"CPU kernels unsupported here: {kernels.unsupported()}")
def test_a_cold_kernel_build_is_announced_before_it_runs(tmp_path: Path) -> None:
    env = {**os.environ, "CHATTTS_VELOCITY_CACHE": str(tmp_path), "CXX": "false"}  # a compiler that fails at once
    done = subprocess.run([sys.executable, "-c", "from chattts_velocity.model import kernels; print(kernels.load())"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=Path(__file__).parents[2])
    assert done.stdout.strip() == "False"  # the build failed, and load() said so without raising
    assert "note: building the CPU kernels (" in done.stderr and str(tmp_path / "kernels") in done.stderr
