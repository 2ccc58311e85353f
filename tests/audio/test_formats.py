"""The one audio-format table: every format the server offers round-trips through the writer; wav and pcm are
exact int16 PCM; the export and web UI use its WAV entry (the encoders themselves: test_encode.py)."""
from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from chattts_velocity.audio import SAMPLE_RATE, float_to_int16, wav_bytes
from chattts_velocity.audio.formats import FORMATS, WAV, audio_format, available_formats

CLIP = (0.4 * np.sin(np.arange(4800) / 9.0)).astype(np.float32)  # 0.2 s


def _decode(data: bytes, name: str, decode_audio) -> tuple[np.ndarray, int]:
    if FORMATS[name].encoder == "av":  # soundfile cannot read raw ADTS AAC or 24 kHz Opus: PyAV decodes
        return decode_audio(data)
    if name == "pcm":  # headerless: soundfile reads it as RAW when told the layout
        return sf.read(io.BytesIO(data), dtype="int16", format="RAW", samplerate=SAMPLE_RATE, channels=1,
                       subtype="PCM_16", endian="LITTLE")
    return sf.read(io.BytesIO(data), dtype="int16")


@pytest.mark.parametrize("name", available_formats())
def test_every_available_format_round_trips_through_the_writer(name: str, decode_audio) -> None:
    spec = FORMATS[name]
    audio, rate = _decode(wav_bytes(CLIP, fmt=name), name, decode_audio)
    assert rate == (48000 if name == "opus" else SAMPLE_RATE) and audio.ndim == 1  # Opus decodes at 48 kHz
    if name == "opus":
        audio = audio[::2]
    if name in ("wav", "pcm", "flac"):  # lossless
        assert np.array_equal(audio, float_to_int16(CLIP))
    else:  # lossy codecs pad a little at the edges
        assert abs(len(audio) - len(CLIP)) <= 4096
    assert spec.media_type.startswith("audio/") and spec.extension.startswith(".")


def test_this_install_encodes_every_format_of_the_table() -> None:
    # PyAV's wheels bundle libmp3lame, libopus, aac and flac; libsndfile 1.2 (soundfile's wheels) has Vorbis
    pytest.importorskip("av")
    if "VORBIS" not in sf.available_subtypes("OGG"):
        pytest.skip("this libsndfile lacks Vorbis")
    assert set(available_formats()) == set(FORMATS) == {"wav", "pcm", "mp3", "opus", "aac", "flac", "ogg"}
    assert available_formats()[:2] == ("wav", "pcm")


def test_pcm_is_int16_as_made_and_wav_has_exact_sizes() -> None:
    assert wav_bytes(CLIP, fmt="pcm") == float_to_int16(CLIP).astype("<i2").tobytes()
    data = wav_bytes(CLIP)
    assert int.from_bytes(data[4:8], "little") == len(data) - 8 and int.from_bytes(data[40:44], "little") == 2 * 4800


def test_unknown_formats_name_fmt() -> None:
    with pytest.raises(ValueError, match="^fmt: unsupported audio format 'aiff'"):
        audio_format("aiff")
    with pytest.raises(ValueError, match="^fmt: "):
        wav_bytes(CLIP, fmt="aiff")


def test_the_export_writes_the_wav_entry(tmp_path) -> None:
    from chattts_velocity.export import plan_export

    (tmp_path / "in.txt").write_text("One.\n")
    plan = plan_export(tmp_path / "in.txt", tmp_path / "out")
    assert plan.lines[0].output == "00001" + WAV.extension and WAV.name == "wav"
