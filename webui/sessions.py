"""Web UI sessions: each browser session's run in progress and its download folder.

A session is gradio's session hash (one per open page; "" for a caller without one, such as a test). A run's stop
flags belong to its session, so one visitor's Interrupt, or a call of the page's interrupt endpoint from elsewhere,
never stops another's run. A session's downloads live in `<root>/<session>/`; they go when the session ends
(`forget`, on the page's unload) and, whoever made them, once older than `ttl_s` (`sweep`, at every run's start).
"""
from __future__ import annotations

import hashlib
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Run:
    """One run's flags and where its files go."""

    folder: Path
    stop: threading.Event = field(default_factory=threading.Event)  # the engine stops at its next step
    interrupted: threading.Event = field(default_factory=threading.Event)  # the session pressed Interrupt


class SessionRuns:
    def __init__(self, root: str | Path, ttl_s: float) -> None:
        self.root, self.ttl_s = Path(root), ttl_s
        self._runs: dict[str, Run] = {}  # session -> its run in progress
        self._lock = threading.Lock()

    def folder(self, session: str) -> Path:
        """The session's download folder (its name a digest: a session hash is the browser's to choose)."""
        return self.root / hashlib.sha256(session.encode()).hexdigest()[:16]

    @contextmanager
    def run(self, session: str) -> Iterator[Run]:
        """A new run of `session`, its session's current one until it ends."""
        run = Run(self.folder(session))
        run.folder.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._runs[session] = run
        try:
            yield run
        finally:
            with self._lock:
                if self._runs.get(session) is run:
                    del self._runs[session]

    def interrupt(self, session: str) -> None:
        with self._lock:
            run = self._runs.get(session)
        if run is not None:
            run.interrupted.set()
            run.stop.set()

    def forget(self, session: str) -> None:
        """The session ended: its run stops, its downloads go."""
        with self._lock:
            run = self._runs.pop(session, None)
        if run is not None:
            run.stop.set()
        shutil.rmtree(self.folder(session), ignore_errors=True)

    def sweep(self, now: float | None = None) -> int:
        """Remove every download (a run's own subfolder) older than ttl_s; returns how many went."""
        cutoff = (time.time() if now is None else now) - self.ttl_s
        removed = 0
        for made in self.root.glob("*/*"):
            try:
                old = made.stat().st_mtime < cutoff
            except OSError:
                continue
            if old:
                shutil.rmtree(made, ignore_errors=True)
                removed += 1
        return removed
