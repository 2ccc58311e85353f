"""Saved voices in the batch export: a JSONL `voice` or the run's default, resolved by text.voice_params."""
from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from chattts_velocity import Chat, InferCodeParams
from chattts_velocity.export import export
from chattts_velocity.serve.voice_fields import VoiceBook
from chattts_velocity.text import VoiceLibrary, encode_prompt

STEPS = 8
PARAMS = InferCodeParams(max_new_token=STEPS, min_new_token=STEPS, show_tqdm=False)



def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _pcm(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as w:
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.int32)


def _lines(out: Path) -> dict[int, dict]:
    doc = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    return {e["line"]: e | {"speaker": doc["speakers"].get(e["speaker_sha256"])} for e in doc["lines"]}


def test_lines_speak_with_saved_voices_and_bad_voices_fail_alone(chat: Chat, tmp_path: Path, monkeypatch) -> None:
    library = VoiceLibrary(tmp_path / "voices")
    speaker = chat.sample_random_speaker()
    library.save("Anna", speaker=speaker)
    library.save("Clip", clip_code=encode_prompt(torch.randint(0, 100, (4, 12))), transcript="some words")
    rows = [{"text": "One.", "voice": "anna", "seed": 1}, {"text": "One.", "speaker": speaker, "seed": 1},
            {"text": "Two.", "voice": "Clip", "seed": 2}, {"text": "Three.", "voice": "nobody"},
            {"text": "Four.", "voice": "alloy"}, {"text": "Five.", "voice": "Anna", "speaker": speaker}]
    seen: list[InferCodeParams] = []
    original = chat.pipeline.synthesis
    monkeypatch.setattr(chat.pipeline, "synthesis", lambda job, *args: seen.extend(job.params) or original(job, *args))
    plan = export(chat, _jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out", params=PARAMS, progress=False,
                  log=lambda _: None, voices=library)
    lines = _lines(tmp_path / "out")
    assert [lines[n]["status"] for n in range(1, 7)] == ["ok", "ok", "ok", "error", "ok", "error"]
    assert lines[1]["voice"] == "anna" and lines[1]["speaker"] == speaker
    first, second = (_pcm(tmp_path / "out" / lines[n]["output"]) for n in (1, 2))
    assert np.array_equal(first, second)  # a seeded request's audio does not depend on its batch
    assert lines[1]["request"] == lines[2]["request"]  # the same speaker and seed: the same request
    clip = next(p for p in seen if p.spk_smp is not None)
    assert clip.txt_smp == "some words" and clip.spk_emb is None and plan.clip_params(plan.lines[2])
    server = VoiceBook(chat.sample_random_speaker, library)
    with pytest.raises(ValueError) as unknown:
        server.params("nobody")
    assert lines[4]["error"] == str(unknown.value)  # the server's words for the same voice
    assert lines[5]["voice"] == "alloy" and lines[5]["speaker"] == server.params("alloy")["spk_emb"]
    assert "one or the other" in lines[6]["error"]


def test_the_default_voice_fills_lines_without_their_own(chat: Chat, tmp_path: Path) -> None:
    library = VoiceLibrary(tmp_path / "voices")
    library.save("Ben", speaker=chat.sample_random_speaker())
    (tmp_path / "in.txt").write_text("Hello.\nAgain.\n", encoding="utf-8")
    export(chat, tmp_path / "in.txt", tmp_path / "out", params=PARAMS, progress=False, log=lambda _: None,
           voice="Ben", voices=library)
    assert {e["voice"] for e in _lines(tmp_path / "out").values()} == {"Ben"}
    with pytest.raises(ValueError, match="^voice: "):
        export(chat, tmp_path / "in.txt", tmp_path / "o2", speaker=library.get("ben").speaker, voice="Ben",
               voices=library)


def test_the_cli_export_draws_presets_and_seeds_as_the_loaded_model_does(chat: Chat, tiny_assets: Path) -> None:
    from chattts_velocity.cli import build_parser
    from chattts_velocity.cli.common import seed_speakers

    args = build_parser().parse_args(["export", "in.txt", "-o", "out", "--model", str(tiny_assets)])
    draw = seed_speakers(args)  # no model loaded: the config's width and the default device
    assert draw(42) == chat.sample_random_speaker(seed=42) and draw(1111) != draw(42)
