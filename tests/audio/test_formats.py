"""The one audio-format table: every format the server offers round-trips through the writer; wav and pcm are
exact int16 PCM; the export and web UI use its WAV entry (the encoders themselves: test_encode.py)."""
from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
import torch

from chattts_velocity.audio import SAMPLE_RATE, float_to_int16, wav_bytes
from chattts_velocity.audio.encode import open_encoder
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
    if spec.channels == 2:  # ogg: ffmpeg's Vorbis encoder takes stereo only; both channels hold the clip
        both = sf.read(io.BytesIO(wav_bytes(CLIP, fmt=name)), dtype="int16")[0]  # libsndfile: the exact length
        assert both.shape == (len(CLIP), 2) and np.array_equal(both[:, 0], both[:, 1])
    if name == "opus":
        audio = audio[::2]
    if name in ("wav", "pcm", "flac"):  # lossless
        assert np.array_equal(audio, float_to_int16(CLIP))
    else:  # lossy codecs pad a little at the edges
        assert abs(len(audio) - len(CLIP)) <= 4096
    assert spec.media_type.startswith("audio/") and spec.extension.startswith(".")


def test_this_install_encodes_every_format_of_the_table() -> None:
    # PyAV's wheels bundle libmp3lame, libopus, aac, flac and ffmpeg's own Vorbis encoder
    pytest.importorskip("av")
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


# ---- a stream's first bytes: the first chunk is at least what each format's encoder holds back ----------------
STEPS_PER_TENTH_OF_A_SECOND = 4  # engine steps in 0.1 s at 40 steps/s (full-size weights on 2 cores run faster)


def _has_audio(data: bytes) -> bool:
    """True once the bytes hold encoded audio: for Ogg, a page with a granule position (header pages have 0)."""
    if not data.startswith(b"OggS"):
        return len(data) > 0
    return any(int.from_bytes(data[i + 6:i + 14], "little", signed=True) > 0 for i in _ogg_pages(data))


def _ogg_pages(data: bytes) -> list[int]:
    return [i for i in range(len(data) - 4) if data[i:i + 4] == b"OggS"]


def _first_call_gives_audio(name: str, samples: int) -> bool:
    noise = (0.1 * np.random.default_rng(0).standard_normal(samples)).astype(np.float32)
    return _has_audio(open_encoder(name).encode(noise))


@pytest.mark.parametrize("name", available_formats())
def test_first_chunk_samples_is_the_least_a_format_must_hold_to_give_out_audio(name: str) -> None:
    need = FORMATS[name].first_chunk_samples
    assert _first_call_gives_audio(name, max(need, 1))
    if need:
        assert not _first_call_gives_audio(name, need - 64)  # the measured minimum, not a loose bound


@pytest.fixture(scope="module")
def decoder_source(tiny_assets):
    from chattts_velocity.speech import SpeechPipeline

    return SpeechPipeline.load(tiny_assets, dtype="float32", device="cpu").stages.mel("decoder")


def _first_audio_step(name: str, mel, streamed_first: int) -> tuple[int, int]:
    """(engine step of the first chunk, engine step of the format's first audio bytes), pushing one step at a time
    as the server's engine does."""
    from chattts_velocity.speech import StreamSet

    streams, encoder, first_chunk = StreamSet(), open_encoder(name), None
    streams.open(0, mel, streamed_first)
    rows = torch.randn(200, mel.stream_decoder(24, None, None).width, generator=torch.Generator().manual_seed(0))
    for step in range(1, len(rows) + 1):
        chunk = streams.push({0: rows[step - 1:step]})[0]
        first_chunk = first_chunk or (step if len(chunk) else None)
        if len(chunk) and _has_audio(encoder.encode(chunk)):
            return first_chunk, step
    raise AssertionError(f"{name}: no audio within {len(rows)} steps")


WAV_STEPS: dict[str, tuple[int, int]] = {}


@pytest.mark.parametrize("name", available_formats())
def test_each_streamed_formats_first_bytes_leave_with_the_first_chunk(name: str, decoder_source) -> None:
    """The server opens each stream with its format's first_chunk_samples: the first encoded audio leaves at the
    first chunk's step, within 0.1 s of wav's."""
    _, wav_step = WAV_STEPS.get("wav") or WAV_STEPS.setdefault("wav", _first_audio_step("wav", decoder_source, 0))
    first_chunk, step = _first_audio_step(name, decoder_source, FORMATS[name].first_chunk_samples)
    assert step == first_chunk
    assert step - wav_step <= STEPS_PER_TENTH_OF_A_SECOND, (name, step, wav_step)
