"""Audio stage: incremental encoders (float32 [-1, 1] chunks -> encoded bytes) for every format of audio/formats.py.

`open_encoder(fmt)` gives one object per clip or response: `encode(chunk) -> bytes` (what the muxer has finished so
far), then `flush() -> bytes` (the rest). Streamed encoders write to a non-seekable in-memory pipe they drain after
each chunk; whole-clip encoders (`streamed=False`: `wav_bytes`, the export) write to a seekable buffer, so headers
hold exact sizes (WAV sizes, FLAC's sample count, MP3's Xing/LAME frame count).
"""
from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .formats import STREAMED_DATA_SIZE, STREAMED_RIFF_SIZE, AudioFormat, audio_format
from .wav import SAMPLE_RATE, as_mono, float_to_int16

if TYPE_CHECKING:
    from typing_extensions import Buffer

# Ogg pages (opus, ogg): ffmpeg's default 1 s would hold a streamed response's bytes back; the first audio page
# leaves after formats.py's first_chunk_samples, 60 ms pages cost ~3.7 kbit/s of page headers
OGG_PAGE_MICROSECONDS = 60_000
STREAM_IO_BUFFER = 4096  # bytes: the muxer's I/O buffer of a streamed response (PyAV's default 32 KB is ~4 s of mp3)


class Encoder(Protocol):
    """One clip or response: encode() every chunk in order, then flush() once."""

    def encode(self, chunk: np.ndarray) -> bytes: ...

    def flush(self) -> bytes: ...


def open_encoder(fmt: str, sample_rate: int = SAMPLE_RATE, streamed: bool = True) -> Encoder:
    """The encoder of format `fmt` (a ValueError naming `fmt` for unknown names)."""
    spec = audio_format(fmt)
    if spec.encoder == "pcm":
        return PcmEncoder()
    if spec.encoder == "wav":
        return WavEncoder(sample_rate, streamed)
    return AvEncoder(spec, sample_rate, streamed)


def wav_bytes(wav: np.ndarray, sample_rate: int = SAMPLE_RATE, fmt: str = "wav") -> bytes:
    """Encode a whole mono float clip as fmt, a name in audio.formats.FORMATS (wav is 16-bit, pcm raw s16le)."""
    encoder = open_encoder(fmt, sample_rate, streamed=False)
    return encoder.encode(as_mono(wav)) + encoder.flush()


def write_wav(path: str | Path, wav: np.ndarray, sample_rate: int = SAMPLE_RATE) -> None:
    """Write a 16-bit PCM mono WAV file."""
    Path(path).write_bytes(wav_bytes(wav, sample_rate))


def _int16(chunk: np.ndarray) -> np.ndarray:  # [N] little-endian int16, float_to_int16's scaling for every format
    return float_to_int16(as_mono(chunk)).astype("<i2")


class PcmEncoder:
    def encode(self, chunk: np.ndarray) -> bytes:
        return _int16(chunk).tobytes()

    def flush(self) -> bytes:
        return b""


def wav_header(sample_rate: int, data_size: int | None) -> bytes:
    """A 16-bit mono WAV header; data_size None: streamed (STREAMED_* sizes, formats.py says why)."""
    riff, data = (STREAMED_RIFF_SIZE, STREAMED_DATA_SIZE) if data_size is None else (36 + data_size, data_size)
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " + struct.pack("<I", 16) + fmt + b"data" + \
        struct.pack("<I", data)


class WavEncoder:
    """Streamed: the header, then samples as they come. Whole: samples kept until flush writes exact sizes."""

    def __init__(self, sample_rate: int, streamed: bool) -> None:
        self.sample_rate, self.streamed = sample_rate, streamed
        self.header_sent = False
        self.kept: list[bytes] = []

    def encode(self, chunk: np.ndarray) -> bytes:
        data = _int16(chunk).tobytes()
        if not self.streamed:
            self.kept.append(data)
            return b""
        return self._header() + data

    def flush(self) -> bytes:
        if self.streamed:
            return self._header()
        data = b"".join(self.kept)
        return wav_header(self.sample_rate, len(data)) + data

    def _header(self) -> bytes:
        if self.header_sent:
            return b""
        self.header_sent = True
        return wav_header(self.sample_rate, None)


class Pipe(io.RawIOBase):
    """A write-only, non-seekable sink for a muxer; drain() hands over what arrived since the last call."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[bytes] = []
        self.size = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def write(self, data: Buffer) -> int:
        view = memoryview(data)
        self.parts.append(view.tobytes())
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        # asking for the end (where the pipe always is) is allowed, as it moves nowhere
        if (offset if whence == io.SEEK_SET else self.size + offset) != self.size:
            raise io.UnsupportedOperation("seek: a streamed encoder cannot go back")
        return self.size

    def drain(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


def _sink(streamed: bool) -> Pipe | io.BytesIO:
    return Pipe() if streamed else io.BytesIO()


def _taken(sink: Pipe | io.BytesIO) -> bytes:
    return sink.drain() if isinstance(sink, Pipe) else b""


class AvEncoder:
    """mp3, aac, opus, flac, ogg through PyAV: one codec context and one muxer writing to the sink."""

    def __init__(self, spec: AudioFormat, sample_rate: int, streamed: bool) -> None:
        import av

        self.av, self.sample_rate, self.sink = av, sample_rate, _sink(streamed)
        options = {"page_duration": str(OGG_PAGE_MICROSECONDS)} if spec.muxer == "ogg" else {}
        if streamed:  # every packet reaches the pipe at once, not when the muxer's I/O buffer fills
            options["flush_packets"] = "1"
        self.container = av.open(self.sink, "w", format=spec.muxer, container_options=options,
                                 buffer_size=STREAM_IO_BUFFER if streamed else 32768)
        codec_options = {"frame_size": str(spec.frame_size)} if spec.frame_size else {}
        if spec.experimental:
            codec_options["strict"] = "experimental"
        if spec.codec is None:
            raise ValueError(f"{spec.name}: names no PyAV codec")
        self.channels, self.samples_in = spec.channels, 0
        layout = "mono" if spec.channels == 1 else "stereo"
        stream = self.container.add_stream(spec.codec, rate=sample_rate, layout=layout, options=codec_options)
        if not isinstance(stream, av.AudioStream):
            raise ValueError(f"{spec.name}: PyAV's {spec.codec!r} is not an audio encoder")
        self.stream = stream
        if spec.bit_rate:
            self.stream.bit_rate = spec.bit_rate

    def encode(self, chunk: np.ndarray) -> bytes:
        samples = _int16(chunk)
        if len(samples):
            interleaved = np.repeat(samples, self.channels)[None, :]  # [1, N * channels]: the clip in each channel
            frame = self.av.AudioFrame.from_ndarray(interleaved, format="s16", layout=self.stream.layout.name)
            frame.sample_rate, frame.pts = self.sample_rate, self.samples_in
            self.samples_in += len(samples)
            self.container.mux(self.stream.encode(frame))  # PyAV re-frames and converts to the codec's format
        return _taken(self.sink)

    def flush(self) -> bytes:
        if self.samples_in:  # ffmpeg's Vorbis encoder never returns from a drain that got no samples
            self.container.mux(self.stream.encode(None))
        self.container.close()
        return _taken(self.sink) if isinstance(self.sink, Pipe) else self.sink.getvalue()
