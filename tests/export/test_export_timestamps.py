"""Sentence timestamps out of Chat.infer_many and the export's NAME.timestamps.json sidecar (tiny weights)."""
from __future__ import annotations

import json
import wave
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from chattts_velocity import Chat, InferCodeParams
from chattts_velocity.audio import SAMPLE_RATE, Spoken
from chattts_velocity.export import plan_export, run_export

STEPS = 8
PARAMS = InferCodeParams(max_new_token=STEPS, min_new_token=STEPS, show_tqdm=False, manual_seed=3)
TEXT = "The first sentence is here. And then comes the second one! Is there a third?"



def test_infer_many_timestamps_cover_the_same_audio(chat: Chat) -> None:
    (_, plain), = chat.infer_many([TEXT], [PARAMS])
    (_, spoken), = chat.infer_many([TEXT], [PARAMS], timestamps=True)
    assert isinstance(spoken, Spoken) and np.array_equal(spoken.wav, plain)
    stamps = spoken.timestamps
    assert [s.text for s in stamps] == list(chat.split(TEXT).texts) and len(stamps) > 1
    assert stamps[0].start == 0 and all(a.end == b.start for a, b in pairwise(stamps))
    assert stamps[-1].end == pytest.approx(len(plain) / SAMPLE_RATE)


def test_export_writes_a_sidecar_per_wav_only_when_asked(chat: Chat, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text(f"{TEXT}\nOne more line.\n", encoding="utf-8")
    plan = plan_export(src, tmp_path / "out", seed=1)
    plan.timestamps = True
    run_export(chat, plan, PARAMS, progress=False, log=lambda _: None)
    for line in plan.lines:
        wav_path = tmp_path / "out" / line.output
        stamps = json.loads(wav_path.with_suffix(".timestamps.json").read_text(encoding="utf-8"))
        with wave.open(str(wav_path)) as w:
            assert stamps[-1]["end"] == pytest.approx(w.getnframes() / SAMPLE_RATE, abs=1e-3)
        assert stamps[0]["start"] == 0 and all(s["text"] for s in stamps)
    plain = plan_export(src, tmp_path / "plain", seed=1)
    run_export(chat, plain, PARAMS, progress=False, log=lambda _: None)
    assert not list((tmp_path / "plain").glob("*.timestamps.json"))

