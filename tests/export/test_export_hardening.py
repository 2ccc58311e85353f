"""Batch export against what broke it: two exports into one folder, a WAV another run wrote, a new or deleted
sidecar on re-run, an output folder that cannot be written (tiny weights)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from chattts_velocity import Chat, InferCodeParams
from chattts_velocity.export import plan_export, run_export
from chattts_velocity.export.lock import LOCK_NAME
from chattts_velocity.export.manifest import replace_atomically

STEPS = 6
PARAMS = InferCodeParams(max_new_token=STEPS, min_new_token=STEPS, show_tqdm=False)
LINES = "First line here.\nSecond line here.\nThird line here.\n"



def export_lines(chat: Chat, tmp_path: Path, out: Path, **kw) -> object:
    src = tmp_path / "lines.txt"
    src.write_text(LINES, encoding="utf-8")
    plan = plan_export(src, out, seed=1, params=PARAMS, **kw)
    return run_export(chat if plan.todo else None, plan, PARAMS, progress=False, log=lambda _: None)


def statuses(plan) -> list[str]:
    return [line.status for line in plan.lines]


def test_a_second_export_into_a_folder_in_use_refuses(tmp_path: Path) -> None:
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from chattts_velocity.export.lock import lock_folder; lock_folder(Path(sys.argv[1])); "
                               "print('locked', flush=True); time.sleep(3600)", str(out)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        src = tmp_path / "lines.txt"
        src.write_text(LINES, encoding="utf-8")
        with pytest.raises(ValueError, match=rf"^output_dir: another export \(pid {holder.pid}\) is writing into"):
            plan_export(src, out, seed=1, params=PARAMS)
    finally:
        holder.kill()
        holder.wait()
    assert plan_export(src, out, seed=1, params=PARAMS).todo  # free again once the other process is gone


def test_temp_names_are_unique_per_write(tmp_path: Path) -> None:
    seen, started = [], threading.Barrier(2)

    def write(tmp: Path) -> None:
        seen.append(tmp.name)
        started.wait(120)  # only so that a lost thread fails the test instead of hanging it
        tmp.write_bytes(b"x")

    threads = [threading.Thread(target=replace_atomically, args=(tmp_path / "a.wav", write)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == 2 and [p.name for p in tmp_path.iterdir()] == ["a.wav"]


def test_a_wav_whose_bytes_are_not_the_recorded_ones_is_made_again(chat: Chat, tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = export_lines(chat, tmp_path, out)
    assert statuses(first) == ["ok"] * 3
    original = (out / "00002.wav").read_bytes()
    shutil.copyfile(out / "00001.wav", out / "00002.wav")  # another run's audio under this name
    second = export_lines(chat, tmp_path, out)
    assert statuses(second) == ["skipped", "ok", "skipped"]
    remade = np.frombuffer((out / "00002.wav").read_bytes()[44:], "<i2").astype(int)
    # the same seed's audio again, alone instead of in a batch of 3: the same samples (docs/fidelity.md)
    assert np.array_equal(remade, np.frombuffer(original[44:], "<i2"))


def test_timestamps_asked_on_a_finished_export_or_deleted_are_written(chat: Chat, tmp_path: Path) -> None:
    out = tmp_path / "out"
    export_lines(chat, tmp_path, out)
    again = export_lines(chat, tmp_path, out, timestamps=True)
    assert statuses(again) == ["ok"] * 3 and len(list(out.glob("*.timestamps.json"))) == 3
    (out / "00003.timestamps.json").unlink()
    third = export_lines(chat, tmp_path, out, timestamps=True)
    assert statuses(third) == ["skipped", "skipped", "ok"] and (out / "00003.timestamps.json").is_file()
    assert statuses(export_lines(chat, tmp_path, out)) == ["skipped"] * 3  # without the option nothing is redone


def test_an_unwritable_output_is_refused_before_any_work(tmp_path: Path, monkeypatch) -> None:
    """Before any work: no line is named, hashed or given its voice (plan.fill_lines, watched, is never called for the
    refused folders, and is for a writable one, so the watch is on the path)."""
    from chattts_velocity.export import plan as plan_module

    src = tmp_path / "lines.txt"
    src.write_text(LINES, encoding="utf-8")
    (tmp_path / "a file").write_text("not a folder")
    filled: list[Path] = []
    fill = plan_module.fill_lines
    monkeypatch.setattr(plan_module, "fill_lines", lambda plan, *a: filled.append(plan.out_dir) or fill(plan, *a))
    with pytest.raises(ValueError, match="^output_dir: .* is a file, not a folder"):
        plan_export(src, tmp_path / "a file", seed=1)
    with pytest.raises(ValueError, match="^output_dir: cannot create"):
        plan_export(src, tmp_path / "a file" / "sub", seed=1)
    assert filled == []
    plan_export(src, tmp_path / "out", seed=1).release()
    assert filled == [tmp_path / "out"]


def test_the_cli_refuses_an_unwritable_output_without_loading_the_model(tmp_path: Path, monkeypatch) -> None:
    import importlib

    from chattts_velocity import cli

    cli_main = importlib.import_module("chattts_velocity.cli.main")

    src = tmp_path / "lines.txt"
    src.write_text(LINES, encoding="utf-8")
    (tmp_path / "taken").write_text("a file")
    monkeypatch.setattr(cli_main, "load_chat", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(SystemExit, match="^error: output_dir: .* is a file"):
        cli.main(["export", str(src), "-o", str(tmp_path / "taken"), "--model", "demo"])
    assert not (tmp_path / "taken.d").exists() and LOCK_NAME not in [p.name for p in tmp_path.iterdir()]
