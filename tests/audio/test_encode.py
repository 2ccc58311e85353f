"""The incremental encoders: every format streamed chunk by chunk decodes to the clip's length, its first bytes come
out with the first chunk, lossless ones equal the whole-clip writer, and the streamed WAV header reads right."""
from __future__ import annotations

import io
import shutil
import subprocess
import wave

import numpy as np
import pytest
import soundfile as sf

from chattts_velocity.audio import SAMPLE_RATE, float_to_int16, open_encoder, samples_for_steps, wav_bytes
from chattts_velocity.audio.encode import Pipe
from chattts_velocity.audio.formats import FORMATS, available_formats

CHUNK = 4800  # 0.2 s, as a streamed response's decode windows
CLIP = (0.4 * np.sin(np.arange(10 * CHUNK) / 9.0) * np.linspace(0.2, 1.0, 10 * CHUNK)).astype(np.float32)  # 2 s
ENCODED = [name for name in available_formats() if name != "pcm"]


def _streamed(fmt: str, clip: np.ndarray = CLIP) -> list[bytes]:
    encoder = open_encoder(fmt)
    return [encoder.encode(clip[k:k + CHUNK]) for k in range(0, len(clip), CHUNK)] + [encoder.flush()]


@pytest.mark.parametrize("fmt", ENCODED)
def test_a_streamed_format_decodes_to_the_clip_length(fmt: str, decode_audio) -> None:
    pieces = _streamed(fmt)
    audio, rate = decode_audio(b"".join(pieces))
    seconds = len(audio) / rate
    assert abs(seconds - len(CLIP) / SAMPLE_RATE) < 0.1, seconds  # codecs pad at most a few frames
    assert np.abs(audio).max() > 0.3 * 32767  # the sine came through, not silence
    # bytes with every chunk: the first as soon as it is encoded, and most of the others
    assert pieces[0] and sum(map(bool, pieces)) >= len(pieces) - 2


STREAM_CHUNKS = (samples_for_steps(4), *[samples_for_steps(28) - samples_for_steps(4)] * 3)  # default stream plan
OPENAI_FORMATS = [name for name in ("mp3", "opus", "aac", "flac", "wav", "pcm") if name in available_formats()]


@pytest.mark.parametrize("fmt", OPENAI_FORMATS)
def test_a_stream_has_decodable_audio_after_its_second_model_chunk(fmt: str, decode_audio) -> None:
    """A server stream's chunks (the first after 4 steps, then every 24) come out with the codec's next frame, not
    when the muxer's I/O buffer fills: bytes with the first chunk (AAC's encoder delay excepted) and audio that
    decodes before the last chunk goes in."""
    encoder, rng, sent = open_encoder(fmt), np.random.default_rng(0), []
    for n in STREAM_CHUNKS:
        sent.append(encoder.encode((0.2 * rng.standard_normal(n)).astype(np.float32)))
    assert sent[0] or fmt == "aac"
    so_far = b"".join(sent[:2])
    samples = len(so_far) // 2 if fmt == "pcm" else len(decode_audio(so_far)[0])
    assert samples > 0, sent


@pytest.mark.parametrize("fmt", ["wav", "pcm", "flac"])
def test_lossless_streams_hold_the_same_samples_as_the_writer(fmt: str, decode_audio) -> None:
    data = b"".join(_streamed(fmt))
    if fmt == "pcm":
        assert data == wav_bytes(CLIP, fmt="pcm") == float_to_int16(CLIP).astype("<i2").tobytes()
        return
    assert np.array_equal(decode_audio(data)[0], decode_audio(wav_bytes(CLIP, fmt=fmt))[0])
    assert np.array_equal(decode_audio(data)[0], float_to_int16(CLIP))


@pytest.mark.parametrize("fmt", available_formats())
def test_an_empty_stream_still_ends_cleanly(fmt: str) -> None:
    encoder = open_encoder(fmt)
    data = encoder.encode(np.zeros(0, np.float32)) + encoder.flush()
    assert isinstance(data, bytes)  # PyAV writes no container header until the first packet: mp3/aac/opus are b""
    if fmt == "wav":
        assert data[:4] == b"RIFF" and len(data) == 44


def test_the_streamed_wav_header_reads_right() -> None:
    data = b"".join(_streamed("wav"))
    audio, rate = sf.read(io.BytesIO(data), dtype="int16")  # libsndfile: the real length
    assert rate == SAMPLE_RATE and np.array_equal(audio, float_to_int16(CLIP))
    with wave.open(io.BytesIO(data)) as w:  # Python's wave trusts the size (12 h) but reads what is there
        assert w.getnframes() > 3600 * SAMPLE_RATE
        assert w.readframes(w.getnframes()) == float_to_int16(CLIP).astype("<i2").tobytes()


@pytest.mark.parametrize("tool", ["ffprobe", "soxi"])
def test_command_line_readers_see_the_streamed_wav_length(tool: str, tmp_path) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    path = tmp_path / "streamed.wav"
    path.write_bytes(b"".join(_streamed("wav")))
    args = {"ffprobe": ["ffprobe", "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0"],
            "soxi": ["soxi", "-D"]}[tool]
    seconds = float(subprocess.run([*args, str(path)], capture_output=True, text=True, check=True).stdout)
    # ffprobe measures the file; sox reads 0x7FFFF000 as "length unknown" (0), not as hours of audio
    assert seconds == (len(CLIP) / SAMPLE_RATE if tool == "ffprobe" else 0.0)


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs the ffmpeg command")
def test_ffmpeg_reads_a_streamed_flac_to_its_last_sample(tmp_path) -> None:
    """A streamed FLAC's header says "length unknown"; docs/serving.md names the readers that cope (ffmpeg does)."""
    path = tmp_path / "streamed.flac"
    path.write_bytes(b"".join(_streamed("flac")))
    done = subprocess.run(["ffmpeg", "-v", "error", "-i", str(path), "-f", "s16le", "-"], capture_output=True,
                          check=True)
    assert np.array_equal(np.frombuffer(done.stdout, "<i2"), float_to_int16(CLIP))


def test_whole_clip_headers_hold_exact_lengths() -> None:
    assert sf.info(io.BytesIO(wav_bytes(CLIP, fmt="flac"))).frames == len(CLIP)  # FLAC STREAMINFO sample count
    data = wav_bytes(CLIP)
    assert int.from_bytes(data[40:44], "little") == 2 * len(CLIP)


def test_the_pipe_refuses_to_go_back() -> None:
    pipe = Pipe()
    pipe.write(b"abc")
    assert pipe.seek(0, io.SEEK_END) == 3 and pipe.drain() == b"abc" and pipe.drain() == b""
    with pytest.raises(io.UnsupportedOperation, match="^seek: "):
        pipe.seek(0)


def test_the_table_names_an_encoder_for_every_format() -> None:
    assert {f.encoder for f in FORMATS.values()} == {"wav", "pcm", "av"}
    with pytest.raises(ValueError, match="^fmt: "):
        open_encoder("aiff")
