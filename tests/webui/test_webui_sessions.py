"""Web UI shared by many visitors, without a browser: a run belongs to its session (Interrupt from another session
stops nothing), a bounded queue, a cap on a run's text, downloads removed when their session ends or they age, and
a voice saved only when the server would take it."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("gradio")

from test_webui_handlers import HIDDEN, RecordingPipeline, _request  # noqa: E402 (after the importorskip above)

from chattts_velocity.text import encode_spk_emb, sample_random_speaker  # noqa: E402 (after the importorskip above)
from chattts_velocity.text.voices import VoiceLibrary  # noqa: E402 (after the importorskip above)
from webui.handlers import Handlers  # noqa: E402 (after the importorskip above)
from webui.library import LibraryHandlers  # noqa: E402 (after the importorskip above)
from webui.voice_check import VoiceCheck  # noqa: E402 (after the importorskip above)

HANG_S = 120.0  # a deadline that only stops a hung test: a run that is never stopped, a thread that never starts


class WaitingPipeline(RecordingPipeline):
    """The code pass runs until its run's stop flag is set (HANG_S at most, only so that a run nobody stops ends);
    `started` is set when it begins, and `stop` is the run's flag."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.stop = lambda: False

    def generate(self, requests, *, stop, **options):
        self.stop = stop
        self.started.set()
        deadline = time.monotonic() + HANG_S
        while not stop() and time.monotonic() < deadline:
            time.sleep(0.01)
        return super().generate(requests, **options)


def _last_stats(handlers: Handlers, session: str, **changes) -> str:
    stats = ""
    for update in handlers.generate(*_request(**changes), session=session):
        if isinstance(update[3], str):
            stats = update[3]
    return stats


def test_interrupt_stops_only_the_callers_run() -> None:
    pipeline = WaitingPipeline()
    handlers = Handlers(pipeline)
    result: list[str] = []
    run = threading.Thread(target=lambda: result.append(_last_stats(handlers, "visitor-a", refine=False)))
    run.start()
    assert pipeline.started.wait(HANG_S)
    handlers.interrupt("visitor-b")  # another visitor's button, or a call of the interrupt endpoint
    handlers.interrupt("")
    run.join(0.5)  # time for a wrongly stopped run to end; its stop flag says so whatever the host's speed
    assert not pipeline.stop() and run.is_alive(), "another session's Interrupt stopped this run"
    handlers.interrupt("visitor-a")
    run.join(HANG_S)
    assert result and result[0].startswith("interrupted:")


def test_a_run_over_the_pages_text_cap_is_refused_before_any_model_work() -> None:
    pipeline = RecordingPipeline()
    with pytest.warns(UserWarning, match="^text: 1201 characters is over this page's limit of 1200"):
        stats = _last_stats(Handlers(pipeline, max_chars=1200), "a", text="x" * 1201)
    assert stats.startswith("error: text: 1201 characters") and pipeline.calls == []


def test_a_sessions_downloads_go_when_it_ends_or_when_they_age() -> None:
    handlers = Handlers(RecordingPipeline(), files_ttl_s=3600)
    downloads = {}
    for session in ("a", "b"):
        list(handlers.generate(*_request(refine=False), session=session))
        downloads[session] = list(handlers.sessions.folder(session).glob("*/speech.wav"))
        assert len(downloads[session]) == 1
    handlers.forget("a")  # visitor a closed the tab
    assert not handlers.sessions.folder("a").exists() and downloads["b"][0].exists()
    old = time.time() - 7200
    os.utime(downloads["b"][0].parent, (old, old))
    list(handlers.generate(*_request(refine=False), session="c"))  # any run sweeps what is past its time
    assert not downloads["b"][0].exists()
    assert len(list(handlers.sessions.folder("c").glob("*/speech.wav"))) == 1


def test_the_page_queues_a_bounded_number_of_runs_and_cleans_its_files(tmp_path: Path) -> None:
    from webui.app import QUEUE_SIZE, build_ui

    page = build_ui(RecordingPipeline(), voices=VoiceLibrary(tmp_path / "voices"))
    assert page._queue.max_size == QUEUE_SIZE and page.delete_cache == (900, 3600)
    unload = [fn for fn in page.fns.values() if any(target[1] == "unload" for target in fn.targets)]
    assert len(unload) == 1  # the session's end removes its downloads
    small = build_ui(RecordingPipeline(), voices=VoiceLibrary(tmp_path / "voices"), queue_size=2, files_ttl_s=60)
    assert small._queue.max_size == 2 and small.delete_cache == (15, 60)


def test_the_page_saves_only_a_speaker_the_server_would_take(tmp_path: Path) -> None:
    check = VoiceCheck(RecordingPipeline(), None)
    library = LibraryHandlers(VoiceLibrary(tmp_path / "voices"), check.fits)
    narrow = encode_spk_emb(torch.randn(16))  # decodes, but is 16 values wide: the server refuses it on every use
    with pytest.raises(ValueError) as server_says:
        check.fits(narrow)  # the front end's check, the call the server makes before saving
    with pytest.warns(UserWarning):
        *_, stats = library.save("Narrow", narrow, "", "")
    assert stats == f"error: {server_says.value}" and "16 values" in stats and HIDDEN == 64
    assert library.names() == []
    *_, stats = library.save("Fits", sample_random_speaker(HIDDEN, seed=3), "", "")
    assert stats == "saved voice 'Fits'"
