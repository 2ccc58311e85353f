"""The export with scripts, blends and captions (tiny weights): a script line's turns and exact pauses, a caption
file beside each WAV whose cues are the audio's spans, a bad tag failing its line alone, a resume that remakes a
WAV whose caption file is gone."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import soundfile as sf

from chattts_velocity import Chat, InferCodeParams
from chattts_velocity.audio.wav import samples_for_steps
from chattts_velocity.export import plan_export, run_export

STEPS = 8
PIECE = samples_for_steps(STEPS)
PARAMS = InferCodeParams(max_new_token=STEPS, min_new_token=STEPS, show_tqdm=False, manual_seed=3)


def export(chat: Chat, src: Path, out: Path, **options):
    plan = plan_export(src, out, seed=1, speaker_for_seed=lambda s: chat.sample_random_speaker(seed=s), **options)
    return run_export(chat, plan, PARAMS, progress=False, log=lambda _: None)


def cues(path: Path) -> list[tuple[str, str, str]]:
    return re.findall(r"\d+\n(\S+) --> (\S+)\n(.+)\n", path.read_text(encoding="utf-8"))


def test_script_lines_blends_and_captions(chat: Chat, tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    lines = [{"text": "[pause: 100ms] Hello there. [voice: echo] [pause: 0.5s] Hi. [pause: 1ms]", "id": "script"},
             {"text": "Plain line.", "id": "plain", "voice": "alloy(2)+1234(1)"},
             {"text": "Bad [pause: soon] tag.", "id": "bad"}, {"text": "Bad [voice: nobody] voice.", "id": "who"}]
    src.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    plan = export(chat, src, tmp_path / "out", captions="srt", voices=None)
    status = {line.id: (line.status, line.error) for line in plan.lines}
    assert status["script"] == ("ok", None) and status["plain"] == ("ok", None)
    assert status["bad"][0] == "error" and "'[pause: soon]' has no duration" in status["bad"][1]
    assert status["who"][0] == "error" and status["who"][1].startswith("text: [voice: nobody]: unknown voice")
    wav, rate = sf.read(tmp_path / "out" / "script.wav", dtype="int16")
    layout = [2400, PIECE, 12000, PIECE, 24]
    assert rate == 24000 and len(wav) == sum(layout)
    edges = np.cumsum([0, *layout])
    assert not wav[: edges[1]].any() and not wav[edges[2] : edges[3]].any() and not wav[edges[4] :].any()
    assert wav[edges[1] : edges[2]].any() and wav[edges[3] : edges[4]].any()
    assert [c[:2] for c in cues(tmp_path / "out" / "script.srt")] == [
        ("00:00:00,100", f"00:00:00,{round((2400 + PIECE) / 24):03d}"),
        (f"00:00:00,{round((14400 + PIECE) / 24):03d}", f"00:00:00,{round((14400 + 2 * PIECE) / 24):03d}")]
    assert [c[2] for c in cues(tmp_path / "out" / "plain.srt")] and not list((tmp_path / "out").glob("*.vtt"))
    assert not list((tmp_path / "out").glob("*.timestamps.json"))

    (tmp_path / "out" / "plain.srt").unlink()
    again = export(chat, src, tmp_path / "out", captions="srt")
    remade = {line.id: line.reason for line in again.lines if line.status in ("ok", "skipped")}
    assert remade == {"script": "already exported", "plain": None}  # only the line whose captions went missing
    assert (tmp_path / "out" / "plain.srt").is_file()
