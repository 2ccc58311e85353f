"""`chattts-velocity serve --ray` stops its whole cluster on SIGTERM / SIGHUP: no raylet, GCS, agent or replica
worker of its session outlives the driver (they used to be left running)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
httpx = pytest.importorskip("httpx")
from chattts_velocity.serve import ray_serve, ray_stop  # noqa: E402 (only once ray and httpx are known present)

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")]
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, driver: subprocess.Popen, timeout: float = 400.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert driver.poll() is None, f"the driver exited with {driver.returncode}"
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise AssertionError(f"{url} not healthy in {timeout:.0f} s")


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_to_the_serve_driver_leaves_no_ray_process(stop: signal.Signals, tiny_assets: Path,
                                                                 tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, **ray_serve.LOOPBACK_ENV, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)  # a private cluster of its own
    command = [sys.executable, "-m", "chattts_velocity.cli", "serve", "--ray", "--model", str(tiny_assets),
               "--no-verify", "--dtype", "float32", "--port", str(port), "--replica-cpus", "0.5"]
    with open(tmp_path / "driver.log", "wb") as log:
        driver = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_healthy(f"http://127.0.0.1:{port}", driver)
            started = ray_stop.descendants(driver.pid)
            names = {Path(f"/proc/{pid}/comm").read_text().strip() for pid, _ in started}
            assert {"raylet", "gcs_server"} <= names, names  # this driver's own cluster
            driver.send_signal(stop)
            assert driver.wait(timeout=180) is not None
        finally:
            if driver.poll() is None:
                driver.kill()
    left = [p for p in started if ray_stop.alive(p)]
    ray_stop.terminate(left, grace_s=5)  # never leave them for the next test, even when this one fails
    assert not left, f"still running after {stop.name}: {left}; log: {(tmp_path / 'driver.log').read_text()[-2000:]}"
