"""Export --loudness: every WAV normalised to a LUFS target (a gain: length unchanged), part of the request hash."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyloudnorm
import pytest
import soundfile

from chattts_velocity import Chat, InferCodeParams, cli
from chattts_velocity.audio import SAMPLE_RATE
from chattts_velocity.audio.loudness import PEAK_LIMIT
from chattts_velocity.export import plan_export, run_export

PARAMS = InferCodeParams(max_new_token=40, min_new_token=40, show_tqdm=False, manual_seed=3)



def _export(chat: Chat, src: Path, out: Path, loudness: float | None):
    plan = plan_export(src, out, seed=1, loudness=loudness)
    run_export(chat, plan, PARAMS, progress=False, log=lambda _: None)
    return plan


def test_export_normalises_each_wav_and_a_new_target_makes_it_again(chat: Chat, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("The first line is read aloud.\nA second, different line.\n", encoding="utf-8")
    plain = _export(chat, src, tmp_path / "plain", None)
    loud = _export(chat, src, tmp_path / "loud", -20.0)
    assert loud.meta["params"]["loudness"] == -20.0 and "loudness" not in plain.meta["params"]
    meter = pyloudnorm.Meter(SAMPLE_RATE)
    for line in loud.lines:
        raw, _ = soundfile.read(tmp_path / "plain" / line.output, dtype="float32")
        wav, _ = soundfile.read(tmp_path / "loud" / line.output, dtype="float32")
        assert len(wav) == len(raw) and np.abs(wav).max() <= PEAK_LIMIT + 1e-4
        measured = meter.integrated_loudness(wav.astype(np.float64))
        # the target, unless the peak limit stopped the gain first
        assert abs(measured + 20.0) <= 0.5 or np.abs(wav).max() >= PEAK_LIMIT - 1e-3
        assert abs(measured - meter.integrated_loudness(raw.astype(np.float64))) > 0.5  # it did change
    again = _export(chat, src, tmp_path / "loud", -20.0)
    assert again.count("skipped") == len(again.lines)  # the same request: kept
    quieter = _export(chat, src, tmp_path / "loud", -30.0)
    assert quieter.count("ok") == len(quieter.lines)  # another target: made again


def test_export_refuses_a_bad_target_naming_the_field(tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("Hello.\n", encoding="utf-8")
    with pytest.raises(ValueError, match="loudness"):
        plan_export(src, tmp_path / "o", loudness=5.0)
    with pytest.raises(SystemExit, match="loudness"):
        cli.main(["export", str(src), "-o", str(tmp_path / "o"), "--model", "demo", "--loudness", "5"])


def test_export_cli_hands_loudness_and_timestamps_to_the_ray_runner(tmp_path: Path, monkeypatch) -> None:
    import importlib

    from chattts_velocity import cluster
    from chattts_velocity.export import ray as ray_export

    cli_main = importlib.import_module("chattts_velocity.cli.main")
    src = tmp_path / "in.txt"
    src.write_text("Hello.\nThere.\n", encoding="utf-8")
    runs: list = []
    monkeypatch.setattr(cli_main, "model_folder", lambda args: (tmp_path / "model", False))
    monkeypatch.setattr(cluster, "init_ray", lambda *a, **k: runs.append("init"))
    monkeypatch.setattr(ray_export, "run_export_ray", lambda root, plan, params, options, **kw: runs.append(
        (root, plan.loudness, plan.timestamps, len(plan.todo), options.actors, options.batch_size, kw["dtype"])))
    cli.main(["export", str(src), "-o", str(tmp_path / "o"), "--model", "demo", "--dtype", "float32", "--ray",
              "--loudness", "-16", "--timestamps", "--actors", "3", "--batch-size", "8"])
    assert runs == ["init", (tmp_path / "model", -16.0, True, 2, 3, 8, "float32")]
