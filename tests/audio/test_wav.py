"""WAV helpers: int16 clipping, WAV files and bytes readable by soundfile, clip loading, sample counts."""
from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from chattts_velocity.audio.encode import wav_bytes, write_wav
from chattts_velocity.audio.wav import float_to_int16, load_clip, samples_for_steps


def test_float_to_int16_clips_and_scales() -> None:
    x = np.array([-3.0, -1.0, -0.5, 0.0, 0.25, 1.0, 1.5, np.nan], dtype=np.float32)
    out = float_to_int16(x)
    assert out.dtype == np.int16
    assert out.tolist() == [-32767, -32767, -16384, 0, 8192, 32767, 32767, 0]  # 0.25*32767 = 8191.75


def test_silence_has_no_divide_by_zero() -> None:
    with np.errstate(all="raise"):
        assert not float_to_int16(np.zeros(100, dtype=np.float32)).any()


def test_write_wav_is_readable_back(tmp_path: Path) -> None:
    wav = 0.5 * np.sin(np.arange(4800) / 10.0).astype(np.float32)
    write_wav(tmp_path / "a.wav", wav)
    info = sf.info(str(tmp_path / "a.wav"))
    assert (info.samplerate, info.channels, info.subtype, info.frames) == (24000, 1, "PCM_16", 4800)
    data, rate = sf.read(str(tmp_path / "a.wav"), dtype="int16")
    assert rate == 24000 and np.array_equal(data, float_to_int16(wav))


def test_wav_bytes_formats() -> None:
    wav = 0.3 * np.sin(np.arange(2400) / 7.0).astype(np.float32)
    data, rate = sf.read(io.BytesIO(wav_bytes(wav, 16000)), dtype="int16")
    assert rate == 16000 and np.array_equal(data, float_to_int16(wav))
    with wave.open(io.BytesIO(wav_bytes(wav))) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24000, 1, 2)
    pcm = wav_bytes(wav, fmt="pcm")
    assert np.array_equal(np.frombuffer(pcm, "<i2"), float_to_int16(wav))
    flac, rate = sf.read(io.BytesIO(wav_bytes(wav, fmt="flac")), dtype="int16")
    assert rate == 24000 and np.array_equal(flac, float_to_int16(wav))
    for fmt in ("ogg", "opus", "mp3"):  # lossy: check the container decodes to the right length
        info = sf.info(io.BytesIO(wav_bytes(wav, fmt=fmt)))
        assert info.samplerate == 24000 and abs(info.frames - 2400) < 2400 // 2
    with pytest.raises(ValueError, match="fmt"):
        wav_bytes(wav, fmt="aiff")
    with pytest.raises(ValueError, match="1-D"):
        wav_bytes(np.zeros((2, 100)))


def test_samples_for_steps() -> None:
    assert [samples_for_steps(t) for t in (0, 1, 2, 47)] == [0, 256, 768, 93 * 256]


def test_load_clip(tmp_path: Path) -> None:
    stereo = np.stack([np.full(1000, 0.5), np.full(1000, -0.25)], axis=1).astype(np.float32)
    sf.write(str(tmp_path / "s.wav"), stereo, 24000, subtype="FLOAT")
    clip = load_clip(tmp_path / "s.wav")
    assert clip.dtype == torch.float32 and clip.shape == (1000,)
    torch.testing.assert_close(clip, torch.full((1000,), 0.125))
    pcm = load_clip(np.array([0, 16384, -32768], dtype=np.int16))
    assert pcm.tolist() == [0.0, 0.5, -1.0]
    with pytest.raises(ValueError, match="24000 Hz"):
        load_clip(np.zeros(100, dtype=np.float32), sample_rate=16000)
    with pytest.raises(ValueError, match="does not exist"):
        load_clip(tmp_path / "none.wav")


def test_a_clip_whose_header_holds_no_length_is_refused_in_our_words(streamed_flac: Path) -> None:
    """A streamed FLAC's STREAMINFO says "length unknown": soundfile cannot read it to its end, so load_clip says
    what it is and how to convert it rather than passing on libsndfile's "array is too big"."""
    with pytest.raises(ValueError, match=r"^wav: .*streamed\.flac.*holds no length .*ffmpeg -i in\.flac out\.flac"):
        load_clip(streamed_flac)
