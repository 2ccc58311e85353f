"""Batch export against an output folder prepared by someone else: links where its files go, a FIFO named like an
output, a record of the wrong shape; and what the record costs: a digest per line (not its text), one manifest
write per run, no lock file left behind. A stub pipeline stands in for the model (no weights needed)."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from chattts_velocity import InferCodeParams
from chattts_velocity.engine.progress import format_rate
from chattts_velocity.export import plan as plan_mod
from chattts_velocity.export import plan_export, run_export
from chattts_velocity.export.lock import LOCK_NAME
from chattts_velocity.export.manifest import JOURNAL, MANIFEST, text_digest
from chattts_velocity.text.pieces import MAX_CALL_CHARS, MAX_PIECE_CHARS

PARAMS = InferCodeParams(max_new_token=4, show_tqdm=False)


class Tones:
    """A speech pipeline that makes a short tone per text; raises KeyboardInterrupt at line `stop_after`."""

    paths, dtype = type("P", (), {"root": Path("stub")})(), "float32"

    def __init__(self, stop_after: int | None = None) -> None:
        self.stop_after = stop_after

    def synthesis(self, job):
        """The job's verbs as SpeechPipeline.synthesis gives them (each(), for a job of shape "each")."""
        return SimpleNamespace(each=lambda: self.each(job))

    def each(self, job):
        for i, _ in enumerate(job.texts):
            if i == self.stop_after:
                raise KeyboardInterrupt
            yield i, np.full(240, 0.1, np.float32)


def lines_file(tmp_path: Path, text: str = "one\ntwo\nthree\n") -> Path:
    src = tmp_path / "in.txt"
    src.write_text(text, encoding="utf-8")
    return src


def export(src: Path, out: Path, pipeline: Tones | None = None, **kw):
    plan = plan_export(src, out, seed=1, params=PARAMS)
    return run_export(pipeline or Tones(), plan, PARAMS, progress=False, log=lambda _: None, **kw)


@pytest.mark.parametrize("name", [LOCK_NAME, JOURNAL, MANIFEST])
def test_a_linked_lock_journal_or_manifest_is_refused_and_never_written_through(tmp_path: Path, name: str) -> None:
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("precious\n")
    (out / name).symlink_to(victim)
    with pytest.raises(ValueError, match=rf"{name}: .*{name} is a symbolic link, not a regular file"):
        plan_export(lines_file(tmp_path), out, seed=1, params=PARAMS)
    assert victim.read_text() == "precious\n" and (out / name).is_symlink()
    assert not (out / LOCK_NAME).exists() or name == LOCK_NAME  # a refused plan leaves no lock behind


def test_a_fifo_named_like_an_output_fails_its_line_and_never_blocks(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "00002.wav")
    result: list = []
    worker = threading.Thread(target=lambda: result.append(export(lines_file(tmp_path), out)), daemon=True)
    worker.start()
    worker.join(30)
    assert result, "the export blocked on the FIFO"
    plan = result[0]
    assert [line.status for line in plan.lines] == ["ok", "error", "ok"]
    assert plan.lines[1].error.startswith("output: ") and "is a FIFO, not a regular file" in plan.lines[1].error
    assert (out / "00002.wav").is_fifo()


def test_a_journal_swapped_for_a_link_mid_run_is_never_written_through(tmp_path: Path) -> None:
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    victim.write_text("precious\n")
    log: list[str] = []

    class Swapper(Tones):
        def each(self, job):
            (out / JOURNAL).symlink_to(victim)  # planted after the plan, before any line lands
            yield from super().each(job)

    plan = plan_export(lines_file(tmp_path), out, seed=1, params=PARAMS)
    run_export(Swapper(), plan, PARAMS, progress=False, log=log.append)
    assert [line.status for line in plan.lines] == ["ok"] * 3 and victim.read_text() == "precious\n"
    assert any("not journalled" in message and "symbolic link" in message for message in log)
    assert not (out / JOURNAL).exists() and json.loads((out / MANIFEST).read_text())["succeeded"] == 3


@pytest.mark.parametrize("name, body, where", [
    (MANIFEST, '{"lines":[{"output":["x"]}]}', 'entry 1: "output" is \\["x"\\]'),
    (MANIFEST, '{"lines": 5}', 'is not an object with a "lines" list'),
    (MANIFEST, "[" * 100_000, "is not JSON"),
    (JOURNAL, '{"output": "00001.wav", "status": "ok"}\n{"output": ["x"]}\n', 'entry 2: "output" is \\["x"\\]'),
    (JOURNAL, '{"output": "00001.wav", "status": "ok", "seed": "nine"}\n', 'entry 1: "seed" is "nine"'),
])
def test_a_record_of_the_wrong_shape_is_one_error_naming_the_file(tmp_path: Path, name: str, body: str,
                                                                  where: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text(body)
    with pytest.raises(ValueError, match=rf"^{name}: {out / name} {where}.*not a record this export wrote"):
        plan_export(lines_file(tmp_path), out, seed=1, params=PARAMS)
    assert not (out / LOCK_NAME).exists()


def test_the_record_holds_a_digest_per_line_and_the_manifest_is_written_once_per_run(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    long_line = ("word " * 999 + "word. ") * 19  # 95,000 characters in sentences of 5,000: within every limit
    src = lines_file(tmp_path, "".join(f"{long_line}{k}\n" for k in range(6)))
    writes: list[int] = []
    original = plan_mod.write_record
    monkeypatch.setattr(plan_mod, "write_record", lambda *a: writes.append(1) or original(*a))
    out = tmp_path / "out"
    plan = export(src, out, chunk_size=2)  # three batches
    assert [line.status for line in plan.lines] == ["ok"] * 6 and writes == [1]
    manifest = (out / MANIFEST).read_bytes()
    assert len(manifest) < 6000 and b"word" not in manifest, len(manifest)  # the input is 570 kB
    entry = json.loads(manifest)["lines"][0]
    assert entry["text_sha256"] == text_digest(plan.lines[0].text) and entry["chars"] == len(plan.lines[0].text)
    again = plan_export(src, out, seed=1, params=PARAMS)  # resumable from the digests alone
    assert [line.reason for line in again.lines] == ["already exported"] * 6
    again.release()


def test_a_line_past_the_size_limits_is_refused_before_any_model_work(tmp_path: Path) -> None:
    src = lines_file(tmp_path, "Short line.\n" + "x" * 10_000_000 + "\n" + "y" * (MAX_PIECE_CHARS + 1) + "\n")
    plan = plan_export(src, tmp_path / "out", seed=1, params=PARAMS)
    assert [line.status for line in plan.lines] == ["pending", "error", "error"]
    assert plan.lines[1].error.startswith(f"text: 10000000 characters is over the limit of {MAX_CALL_CHARS}")
    assert plan.lines[2].error.startswith(f"text: a sentence of {MAX_PIECE_CHARS + 1} characters is over the limit")
    plan.release()
    one_line = lines_file(tmp_path, "x" * 10_000_000 + "\n")
    plan = plan_export(one_line, tmp_path / "out", seed=1, params=PARAMS)
    assert not plan.todo  # so nothing loads a model for it
    run_export(None, plan, PARAMS, progress=False, log=lambda _: None)
    assert (tmp_path / "out" / MANIFEST).stat().st_size < 5000


def test_the_lock_file_is_removed_when_an_export_ends(tmp_path: Path) -> None:
    out = tmp_path / "out"
    export(lines_file(tmp_path), out)
    assert not (out / LOCK_NAME).exists()
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C mid-run
        export(lines_file(tmp_path, "four\nfive\nsix\n"), out, Tones(stop_after=1))
    assert not (out / LOCK_NAME).exists()
    plan = plan_export(lines_file(tmp_path), out, seed=1, params=PARAMS)
    assert (out / LOCK_NAME).exists()  # held while the plan is alive
    plan.release()
    assert not (out / LOCK_NAME).exists()


def test_the_cli_removes_the_lock_when_the_model_fails_to_load(tmp_path: Path, monkeypatch) -> None:
    import importlib

    from chattts_velocity import cli

    cli_main = importlib.import_module("chattts_velocity.cli.main")

    def no_model(*_: object, **__: object) -> None:
        raise ValueError("model: cannot load (as a test)")

    monkeypatch.setattr(cli_main, "load_chat", no_model)
    with pytest.raises(SystemExit, match="model: cannot load"):
        cli.main(["export", str(lines_file(tmp_path)), "-o", str(tmp_path / "out"), "--model", "demo"])
    assert not (tmp_path / "out" / LOCK_NAME).exists()


@pytest.mark.parametrize("count, seconds, shown", [
    (100, 8, "12 lines/s"), (5, 3, "1.7 lines/s"), (1, 33, "0.03 lines/s"), (1, 150, "150 s a line")])
def test_a_slow_rate_is_shown_as_it_is(count: int, seconds: float, shown: str) -> None:
    assert format_rate(count, seconds, "line") == shown
