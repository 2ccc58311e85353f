"""Progress output: a live bar only where someone watches (a terminal), one summary line in a log."""
from __future__ import annotations

import io

import pytest

from chattts_velocity.engine import progress


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def _run(monkeypatch: pytest.MonkeyPatch, tty: bool, enabled: bool = True) -> str:
    stream = _Stream(tty)
    monkeypatch.setattr(progress.sys, "stderr", stream)
    with progress.progress_bar(10, "code", "step", enabled=enabled) as bar:
        for _ in range(7):
            bar.update(1)
    return stream.getvalue()


def test_a_log_gets_one_summary_line_without_carriage_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _run(monkeypatch, tty=False)
    assert "\r" not in out and out.count("\n") == 1
    assert out.startswith("code: 7/10 steps in ")


def test_a_terminal_gets_the_live_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _run(monkeypatch, tty=True)
    assert "\r" in out and "code" in out


def test_disabled_progress_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run(monkeypatch, tty=False, enabled=False) == ""
    assert _run(monkeypatch, tty=True, enabled=False) == ""
