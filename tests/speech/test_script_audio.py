"""A script's audio: turns joined with exact silences, every piece's span counted in samples, captions from them."""
from __future__ import annotations

import numpy as np
import pytest

from chattts_velocity.audio import Spoken, piece_timestamps
from chattts_velocity.audio.captions import captions, check_captions, cue_text
from chattts_velocity.audio.timestamps import Timestamp, sample_span
from chattts_velocity.params import InferCodeParams
from chattts_velocity.speech.script_audio import join_script, piece_silences, silence_chunks, turn_params
from chattts_velocity.text.script import parse_script

RATE = 24000


def spoken(texts: list[str], lengths: list[int], value: float) -> Spoken:
    return Spoken(np.full(sum(lengths), value, np.float32), piece_timestamps(texts, lengths))


def test_turns_are_joined_with_silences_exact_to_the_sample() -> None:
    script = parse_script("[pause: 10ms] A. B. [pause: 1.5s] [voice: echo] C. [pause: 1ms]", RATE)
    assert script is not None
    joined = join_script(script, [spoken(["A.", "B."], [1000, 777], 0.5), spoken(["C."], [333], -0.5)])
    assert len(joined.wav) == 240 + 1777 + 36000 + 333 + 24
    assert not joined.wav[:240].any() and (joined.wav[240:2017] == 0.5).all()
    assert not joined.wav[2017:38017].any() and (joined.wav[38017:38350] == -0.5).all() and not joined.wav[-24:].any()
    spans = [sample_span(s) for s in joined.timestamps]
    assert spans == [(240, 1240), (1240, 2017), (38017, 38350)]
    assert [s.text for s in joined.timestamps] == ["A.", "B.", "C."]


def test_the_server_streams_the_same_silences_before_the_same_pieces() -> None:
    script = parse_script("A. [pause: 1s] B. C. [voice: 3] [pause: 2ms] D. [pause: 3s]", RATE)
    assert script is not None
    assert piece_silences(script, [0, 1, 1, 2]) == {1: 24000, 3: 48, 4: 72000}
    chunks = list(silence_chunks(60000))
    assert [len(c) for c in chunks] == [24000, 24000, 12000] and not np.concatenate(chunks).any()


def test_each_turn_gets_its_tags_voice_and_a_bad_one_names_the_tag() -> None:
    script = parse_script("A. [voice: echo] B. [voice: echo] C.", RATE)
    assert script is not None
    base = InferCodeParams(manual_seed=3)
    fields = {"spk_emb": "SPK", "spk_smp": None, "txt_smp": None}
    params = turn_params(script, base, lambda voice: fields)  # type: ignore[arg-type,return-value]
    assert params[0] is base and params[1] is params[2] and params[1].spk_emb == "SPK" and params[1].manual_seed == 3

    def unknown(voice: str) -> dict:
        raise ValueError(f"voice: unknown voice {voice!r}")
    with pytest.raises(ValueError, match=r"^input: \[voice: echo\]: unknown voice 'echo'"):
        turn_params(script, base, unknown)  # type: ignore[arg-type]


def test_captions_are_the_sample_spans_in_milliseconds() -> None:
    stamps = [Timestamp("Hello [uv_break] there.", 0.0, 36012 / RATE), Timestamp("[laugh]", 36012 / RATE, 1.6),
              Timestamp("a <b> & c", 1.6, 3725 + 0.0)]
    srt = captions(stamps, "srt")
    assert srt == ("1\n00:00:00,000 --> 00:00:01,501\nHello there.\n\n"
                   "2\n00:00:01,600 --> 01:02:05,000\na <b> & c\n")
    vtt = captions(stamps, "VTT")
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.501\nHello there.\n")
    assert "01:02:05.000\na &lt;b&gt; &amp; c\n" in vtt
    assert cue_text("a\n\nb  [uv_break]") == "a b"
    assert check_captions(None) is None and check_captions("SRT") == "srt"
    with pytest.raises(ValueError, match="^captions: "):
        check_captions("ass")
