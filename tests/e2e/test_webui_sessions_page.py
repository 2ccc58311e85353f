"""The web UI as several visitors meet it, through gradio's own API (no browser): a run belongs to its session, so
another client's call of the interrupt endpoint stops nothing of it; the queue holds a bounded number of runs, tells
a waiting one its position, and refuses one more at once."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
LONG = " ".join(f"Sentence number {k} of a long text, read aloud." for k in range(100))  # ~10 s on tiny weights


def _values(text: str) -> list:
    """The page's Generate inputs (webui.controls.Request's order): refine off, split, one piece a batch."""
    return [text, "", "", "", False, 2, 0, 6, 1, 42, 2, 5, 0.3, 0.7, 20, True, 1, "wav"]


@pytest.fixture(scope="module")
def page_url(tiny_assets: Path, tmp_path_factory) -> Iterator[str]:
    pytest.importorskip("gradio_client")
    tmp = tmp_path_factory.mktemp("webui-sessions")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, str(REPO / "webui" / "app.py"), "--model", str(tiny_assets), "--no-verify", "--host",
           "127.0.0.1", "--port", str(port), "--max-new-token", "256", "--queue-size", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GRADIO_ANALYTICS_ENABLED": "False",
           "GRADIO_TEMP_DIR": str(tmp / "gradio"), "CHATTTS_VELOCITY_VOICES": str(tmp / "voices")}
    log = tmp / "webui.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except OSError:
                time.sleep(1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _client(url: str):
    from gradio_client import Client

    return Client(url, verbose=False, download_files=False)


def _processing(job, timeout: float = 60) -> None:
    """Wait until the run is on the engine (its handler has yielded its first update)."""
    from gradio_client.utils import Status

    deadline = time.monotonic() + timeout
    while job.status().code not in (Status.PROCESSING, Status.ITERATING):
        assert not job.done() and time.monotonic() < deadline, job.status()
        time.sleep(0.05)


def test_only_the_callers_own_interrupt_stops_its_run(page_url: str) -> None:
    visitor, stranger = _client(page_url), _client(page_url)
    job = visitor.submit(*_values(LONG), api_name="/generate")
    _processing(job)
    stranger.predict(api_name="/interrupt")  # a call of the endpoint from another session
    time.sleep(0.5)
    assert not job.done()
    visitor.predict(api_name="/interrupt")  # the visitor's own button
    *_, stats = job.result(timeout=120)
    assert stats.startswith("interrupted:"), stats


def test_the_queue_is_bounded_and_a_waiting_run_knows_its_place(page_url: str) -> None:
    first, second, third = _client(page_url), _client(page_url), _client(page_url)
    running = first.submit(*_values(LONG), api_name="/generate")
    _processing(running)
    waiting = second.submit(*_values("Hello there."), api_name="/generate")
    deadline = time.monotonic() + 120  # a deadline for a hung test only
    while waiting.status().rank is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (waiting.status().rank, waiting.status().queue_size) == (0, 1)  # shown as "queue: 1/1"
    refused = third.submit(*_values("Hello there."), api_name="/generate")
    with pytest.raises(Exception, match="(?i)queue is full"):
        refused.result(timeout=120)  # refused, not timed out: a TimeoutError does not match
    assert not running.done()  # refused at once, while the first run still holds the engine
    assert running.result(timeout=300)[-1].startswith("audio:")
    assert waiting.result(timeout=300)[-1].startswith("audio:")
