"""`chattts-velocity say` with a voice blend, a script and captions on the tiny random weights: the pauses are in the
WAV to the sample, the caption file's cues are the pieces' spans, a bad tag fails before the model loads."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from chattts_velocity import cli
from chattts_velocity.cli import common

FAST = ["--dtype", "float32", "--max-new-token", "6", "--seed", "3", "--voices"]


def say(tiny_assets: Path, tmp_path: Path, text: str, name: str, *extra: str) -> Path:
    out = tmp_path / f"{name}.wav"
    cli.main(["say", text, "-o", str(out), "--model", str(tiny_assets), *FAST, str(tmp_path / "voices"), *extra])
    return out


def cue_ms(clock: str) -> int:
    h, m, s, ms = (int(part) for part in re.split(r"[:.,]", clock))
    return ((h * 60 + m) * 60 + s) * 1000 + ms


def test_a_script_has_its_pauses_to_the_sample_and_its_captions_match_the_audio(tiny_assets: Path, tmp_path: Path,
                                                                                capsys) -> None:
    out = say(tiny_assets, tmp_path, "[pause: 250ms] Hello there. [voice: alloy(2)+1234(1)] [pause: 1s] Bye now.",
              "script", "--voice", "echo", "--captions", "vtt")
    wav, rate = sf.read(out, dtype="int16")
    vtt = out.with_suffix(".vtt").read_text(encoding="utf-8")
    assert vtt.startswith("WEBVTT\n") and "Hello there" in vtt and "Bye now" in vtt
    spans = [(cue_ms(a), cue_ms(b)) for a, b in re.findall(r"(\S+) --> (\S+)", vtt)]
    assert len(spans) == 2 and spans[0][0] == 250 and spans[-1][1] == round(len(wav) * 1000 / rate)
    gap = (spans[0][1], spans[1][0])
    assert gap[1] - gap[0] in (999, 1000, 1001)  # 1 s of silence, edges rounded to the millisecond
    assert not wav[: 6000].any()  # the leading 250 ms is exact zeros
    silence = wav[gap[0] * 24 + 12 : gap[1] * 24 - 12]  # a cue edge is its sample rounded to the ms (24 samples)
    assert rate == 24000 and len(silence) > 23900 and not silence.any()
    assert "and " in capsys.readouterr().out


def test_the_same_blend_is_the_same_audio_and_another_blend_is_not(tiny_assets: Path, tmp_path: Path) -> None:
    first = say(tiny_assets, tmp_path, "Hello there.", "a", "--voice", "alloy(2)+1234(1)").read_bytes()
    again = say(tiny_assets, tmp_path, "Hello there.", "b", "--voice", "alloy(2) + 1234(1)").read_bytes()
    other = say(tiny_assets, tmp_path, "Hello there.", "c", "--voice", "alloy(1)+1234(2)").read_bytes()
    assert first == again and first != other
    assert np.frombuffer(first[44:], np.int16).any()


def test_bad_tags_and_voices_fail_in_one_line_naming_them(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(common, "ensure_model", lambda *a: pytest.fail("the model was resolved"))
    with pytest.raises(SystemExit, match=r"^error: text: '\[pause: soon\]' has no duration"):
        cli.main(["say", "Hi [pause: soon] there.", "-o", str(tmp_path / "x.wav")])
    with pytest.raises(SystemExit, match="^error: --voice: given with --speaker"):
        cli.main(["say", "Hi.", "-o", str(tmp_path / "x.wav"), "--voice", "echo", "--speaker", "x"])


def test_an_unknown_voice_names_the_flag_it_came_from(tiny_assets: Path, tmp_path: Path) -> None:
    for flag in ("--voice", "--speaker"):
        with pytest.raises(SystemExit, match=f"^error: {flag}: unknown voice 'nobody'"):
            say(tiny_assets, tmp_path, "Hi.", "x", flag, "nobody")
    with pytest.raises(SystemExit, match=r"^error: --voice: blend part 'nobody'"):
        say(tiny_assets, tmp_path, "Hi.", "x", "--voice", "alloy+nobody")
