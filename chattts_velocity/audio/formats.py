"""Audio stage: the one table of encoded audio formats and which encoder writes each, read by the encoders
(audio/encode.py: the writer `wav_bytes`, the export, the server's streams) and the web UI.

wav (16-bit mono) and raw pcm (s16le) are written by numpy and struct; mp3, opus, aac, flac and ogg by PyAV (its
wheels bundle ffmpeg with libmp3lame, libopus, aac, flac and ffmpeg's own Vorbis encoder; the `server` extra installs
it). `available_formats` lists what this install can encode.
"""
from __future__ import annotations

from dataclasses import dataclass

# A streamed WAV's RIFF and data sizes (its length is not known when the header goes out). 0xFFFFFFFF RIFF +
# 0x7FFFF000 data: soundfile, ffmpeg/ffprobe and sox read the real length (sox calls it "unknown" instead of
# warning of a premature end, as it does for 0xFFFFFFFF); Python's `wave` reports a huge getnframes() for any
# unknown size but readframes() returns the real data; sizes of 0 make wave, soundfile and sox read nothing.
STREAMED_RIFF_SIZE, STREAMED_DATA_SIZE = 0xFFFFFFFF, 0x7FFFF000


@dataclass(frozen=True)
class AudioFormat:
    name: str  # the `fmt` / OpenAI `response_format` value
    media_type: str  # HTTP Content-Type
    extension: str  # file suffix, with the dot
    encoder: str  # "pcm" | "wav" (numpy), "av" (PyAV: codec + muxer)
    codec: str | None = None  # PyAV encoder name
    muxer: str | None = None  # PyAV container format (raw mp3 frames, ADTS, Ogg, native FLAC)
    bit_rate: int | None = None  # bits/s of a lossy PyAV codec (speech at 24 kHz mono); None: the codec's default
    frame_size: int | None = None  # samples per PyAV codec frame where the codec's default is too long to stream
    # Channels the codec is given (the mono clip in each): ffmpeg's Vorbis encoder takes stereo only, so an ogg
    # decodes to two equal channels (coupled, they cost little more than one)
    channels: int = 1
    experimental: bool = False  # an encoder ffmpeg marks experimental (its Vorbis): opened with strict=experimental
    # The fewest samples one encode() call must get before the encoder gives out audio (frame + encoder delay, and
    # for Ogg a whole page): a stream's first chunk is at least this long, so its first bytes leave with it.
    first_chunk_samples: int = 0


FORMATS: dict[str, AudioFormat] = {f.name: f for f in (
    AudioFormat("wav", "audio/wav", ".wav", "wav"),
    AudioFormat("pcm", "audio/pcm", ".pcm", "pcm"),
    # Measured with tests/audio/test_formats.py's first_audio_samples: mp3 three 576-sample MPEG-2 frames (LAME's
    # delay), aac 1024 priming + one 1024 frame, opus two 60 ms Ogg pages (encode.OGG_PAGE_MICROSECONDS), flac one
    # block, ogg (Vorbis) ffmpeg's encoder delay and the first 60 ms page. libsndfile's Vorbis writer is not
    # used: its Ogg pages fill by bytes (4 KB: 0.7 s of noise, over 2 s of a tone) and cannot be flushed.
    AudioFormat("mp3", "audio/mpeg", ".mp3", "av", "libmp3lame", "mp3", 64_000, first_chunk_samples=1728),
    AudioFormat("opus", "audio/ogg; codecs=opus", ".opus", "av", "libopus", "ogg", 32_000, first_chunk_samples=2880),
    AudioFormat("aac", "audio/aac", ".aac", "av", "aac", "adts", 64_000, first_chunk_samples=2048),
    # FLAC's default block at 24 kHz (2304 samples) is longer than a stream's first chunk (4 steps, 2048 samples)
    AudioFormat("flac", "audio/flac", ".flac", "av", "flac", "flac", frame_size=1152, first_chunk_samples=1152),
    AudioFormat("ogg", "audio/ogg; codecs=vorbis", ".ogg", "av", "vorbis", "ogg", channels=2, experimental=True,
                first_chunk_samples=4096),
)}
WAV = FORMATS["wav"]  # what the export writes and the web UI plays


def audio_format(name: str) -> AudioFormat:
    """The format called `name`; a ValueError naming `fmt` (and the choices) for any other."""
    if name not in FORMATS:
        raise ValueError(f"fmt: unsupported audio format {name!r}; choose one of {list(FORMATS)}")
    return FORMATS[name]


def available_formats() -> tuple[str, ...]:
    """The formats this install can encode: wav and pcm always, the others when PyAV has the codec."""
    return tuple(name for name, f in FORMATS.items() if _can_encode(f))


def _can_encode(f: AudioFormat) -> bool:
    if f.encoder != "av":
        return True
    if f.codec is None:
        return False
    try:
        import av

        av.codec.Codec(f.codec, "w")
    except (ImportError, ValueError):  # PyAV missing, or its ffmpeg lacks the encoder
        return False
    return True
