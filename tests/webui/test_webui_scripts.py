"""The page with a script, a blend and captions on the tiny random weights: the turns and pauses in the audio, the
caption file offered beside the download, a bad tag as the page's error line."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gradio")

from chattts_velocity import Chat  # noqa: E402 (after the importorskip above)
from chattts_velocity.audio.wav import samples_for_steps  # noqa: E402 (after the importorskip above)
from webui.handlers import Handlers, Request  # noqa: E402 (after the importorskip above)

STEPS = 6


@pytest.fixture(scope="module")
def handlers(tiny_assets: Path) -> Handlers:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True)
    return Handlers(chat.pipeline, max_new_token=STEPS)


def final(handlers: Handlers, stream: bool = False, **changes) -> list:
    """Each output's last value after the run: [audio, download, spoken, stats]."""
    values = dict(text="Hello there.", speaker="alloy(2)+1234(1)", clip_code="", transcript="", refine=False, oral=2,
                  laugh=0, pause=6, refine_beams=1, text_seed=42, audio_seed=None, speed=5, temperature=0.3,
                  top_p=0.7, top_k=20, split_text=True, batch_size=4, fmt="wav", captions="none")
    values.update(changes)
    run = handlers.generate_stream if stream else handlers.generate
    shown: list = [None] * (5 if stream else 4)
    for update in run(*Request(**values).__dict__.values()):
        shown = [old if isinstance(new, dict) and new.get("__type__") == "update" else new
                 for old, new in zip(shown, update, strict=True)]
    return shown[1:] if stream else shown


@pytest.mark.parametrize("stream", [False, True])
def test_a_script_run_has_its_pauses_and_offers_the_captions(handlers: Handlers, stream: bool) -> None:
    audio, download, spoken, stats = final(handlers, stream, text="Hi there. [pause: 0.5s] [voice: echo] Bye now.",
                                           captions="vtt")
    rate, wav = audio
    piece = samples_for_steps(STEPS)
    assert stats.startswith("audio: ") and rate == 24000 and len(wav) == 2 * piece + 12000
    assert not wav[piece : piece + 12000].any() and wav[:piece].any() and wav[-piece:].any()
    assert isinstance(download, list) and [Path(f).suffix for f in download] == [".wav", ".vtt"]
    vtt = Path(download[1]).read_text(encoding="utf-8")
    assert vtt.startswith("WEBVTT") and "Bye now" in vtt and spoken.splitlines() == ["Hi there.", "Bye now."]


def test_a_plain_run_with_captions_and_a_bad_tag(handlers: Handlers) -> None:
    audio, download, _, _ = final(handlers, captions="srt")
    assert Path(download[1]).read_text(encoding="utf-8").startswith("1\n00:00:00,000 --> ")
    assert len(audio[1]) == samples_for_steps(STEPS)
    *_, stats = final(handlers, text="Hi [pause: soon].")
    assert stats.startswith("error: text: '[pause: soon]' has no duration")
    *_, stats = final(handlers, text="Hi [voice: nobody] there.")
    assert stats.startswith("error: text: [voice: nobody]: unknown voice")
    audio, download, _, _ = final(handlers)  # no tags, no captions: the plain run, one file
    assert isinstance(download, str) and np.asarray(audio[1]).any()
