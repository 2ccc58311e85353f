"""E2E fixtures for the Gradio web UI: the UI as a subprocess on tiny weights, and a headless Chromium page."""
from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WEBUI_CHROMIUM = Path("/usr/bin/chromium")
WEBUI_CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-quic", "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
    "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",  # a microphone that plays a tone
]
WEBUI_START_TIMEOUT = 240.0  # seconds: python + gradio import and the tiny model load on a busy 2-core box


@dataclass(frozen=True)
class WebUIServer:
    url: str
    log: Path
    voices: Path  # the page's voice library folder ($CHATTTS_VELOCITY_VOICES)


@pytest.fixture(scope="session")
def webui_requirements() -> None:
    """Skip (not fail) when the browser stack is not installed; everything else must work."""
    if not WEBUI_CHROMIUM.exists():
        pytest.skip(f"{WEBUI_CHROMIUM} not found (apt-get install chromium)")
    pytest.importorskip("gradio", reason="gradio not installed (pip install -e '.[webui]')")
    pytest.importorskip("playwright.sync_api", reason="playwright not installed (pip install playwright)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _engine_ready() -> bool:
    # The velocity engine lands separately; until it does, the UI runs on the plain path.
    return importlib.util.find_spec("chattts_velocity.engine.llm") is not None


def _wait_until_up(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + WEBUI_START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"web UI exited with {proc.returncode} before serving:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1.0)
    pytest.fail(f"web UI did not answer on {url} within {WEBUI_START_TIMEOUT:.0f} s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def webui_server(webui_requirements: None, tiny_assets: Path, tmp_path_factory) -> Iterator[WebUIServer]:
    """`python webui/app.py` on the tiny demo checkpoint, bound to 127.0.0.1 on a free port."""
    tmp = tmp_path_factory.mktemp("webui")
    port = _free_port()
    cmd = [sys.executable, str(REPO / "webui" / "app.py"), "--model", str(tiny_assets), "--no-verify",
           "--host", "127.0.0.1", "--port", str(port), "--max-new-token", "256"]
    if not _engine_ready():
        cmd.append("--plain")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRADIO_ANALYTICS_ENABLED": "False",
           "GRADIO_TEMP_DIR": str(tmp / "gradio"), "PYTHONUNBUFFERED": "1",
           "CHATTTS_VELOCITY_VOICES": str(tmp / "voices")}
    log = tmp / "webui.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    url = f"http://127.0.0.1:{port}/"
    try:
        _wait_until_up(proc, url, log)
        yield WebUIServer(url, log, tmp / "voices")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def webui_page(webui_server: WebUIServer, tmp_path_factory):
    """A fresh headless Chromium (own user-data-dir) with the UI loaded."""
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        ctx = pw.chromium.launch_persistent_context(
            str(profile), executable_path=str(WEBUI_CHROMIUM), args=WEBUI_CHROMIUM_ARGS, headless=True,
            viewport={"width": 1280, "height": 1100},
        )
        try:
            page = ctx.new_page()
            page.set_default_timeout(120_000)
            page.goto(webui_server.url, wait_until="domcontentloaded")
            page.wait_for_selector("#generate")
            yield page
        finally:
            ctx.close()
