"""The one audio-format table: every format the server offers round-trips through the writer and soundfile;
streamable formats really are int16 PCM as they are made; the export and web UI use its WAV entry."""
from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from chattts_velocity.audio import SAMPLE_RATE, float_to_int16, wav_bytes
from chattts_velocity.audio.formats import FORMATS, WAV, audio_format, available_formats

CLIP = (0.4 * np.sin(np.arange(4800) / 9.0)).astype(np.float32)  # 0.2 s


def _decode(data: bytes, name: str) -> tuple[np.ndarray, int]:
    if name == "pcm":  # headerless: soundfile reads it as RAW when told the layout
        return sf.read(io.BytesIO(data), dtype="int16", format="RAW", samplerate=SAMPLE_RATE, channels=1,
                       subtype="PCM_16", endian="LITTLE")
    return sf.read(io.BytesIO(data), dtype="int16")


@pytest.mark.parametrize("name", available_formats())
def test_every_available_format_round_trips_through_the_writer(name: str) -> None:
    spec = FORMATS[name]
    audio, rate = _decode(wav_bytes(CLIP, fmt=name), name)
    assert rate == SAMPLE_RATE and audio.ndim == 1
    if spec.streamable or name == "flac":  # lossless
        assert np.array_equal(audio, float_to_int16(CLIP))
    else:  # lossy codecs pad a little at the edges
        assert abs(len(audio) - len(CLIP)) <= 4096
    assert spec.media_type.startswith("audio/") and spec.extension.startswith(".")


def test_this_install_encodes_every_format_of_the_table() -> None:
    # libsndfile 1.2 (soundfile's wheels) has FLAC, Vorbis, Opus and MP3; an older one may not
    have = sf.available_formats()
    if not all(f.container in have for f in FORMATS.values() if f.container):
        pytest.skip("this libsndfile lacks a container")
    assert set(available_formats()) == set(FORMATS)
    assert available_formats()[:2] == ("wav", "pcm")


def test_streamable_means_int16_pcm_and_the_rest_need_soundfile() -> None:
    assert all(spec.streamable == (spec.container is None) for spec in FORMATS.values())
    assert wav_bytes(CLIP, fmt="pcm") == float_to_int16(CLIP).astype("<i2").tobytes()


def test_unknown_formats_name_fmt() -> None:
    with pytest.raises(ValueError, match="^fmt: unsupported audio format 'aac'"):
        audio_format("aac")
    with pytest.raises(ValueError, match="^fmt: "):
        wav_bytes(CLIP, fmt="aiff")


def test_the_export_writes_the_wav_entry(tmp_path) -> None:
    from chattts_velocity.export import plan_export

    (tmp_path / "in.txt").write_text("One.\n")
    plan = plan_export(tmp_path / "in.txt", tmp_path / "out")
    assert plan.lines[0].output == "00001" + WAV.extension and WAV.name == "wav"
