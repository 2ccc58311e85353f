"""Waiting for a server subprocess the e2e tests started: /health answers 200, or the test fails with its log."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

START_DEADLINE_S = 240.0  # only stops a server that never comes up; a slow host just takes longer


def wait_healthy(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the server did not start"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.5)
