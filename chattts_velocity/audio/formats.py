"""Audio stage: the one table of encoded audio formats, read by the writer (wav.wav_bytes), the server,
the web UI and the export.

wav (16-bit mono) and raw pcm (s16le) are written by the stdlib; the others by soundfile (libsndfile),
and only when the installed libsndfile can encode them (`available_formats`).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AudioFormat:
    name: str  # the `fmt` / OpenAI `response_format` value
    media_type: str  # HTTP Content-Type
    extension: str  # file suffix, with the dot
    streamable: bool  # int16 samples can be sent as they are made (after a header for wav)
    container: str | None = None  # libsndfile format; None: written without soundfile
    subtype: str | None = None  # libsndfile subtype


FORMATS: dict[str, AudioFormat] = {f.name: f for f in (
    AudioFormat("wav", "audio/wav", ".wav", streamable=True),
    AudioFormat("pcm", "audio/pcm", ".pcm", streamable=True),
    AudioFormat("flac", "audio/flac", ".flac", False, "FLAC", "PCM_16"),
    AudioFormat("mp3", "audio/mpeg", ".mp3", False, "MP3", "MPEG_LAYER_III"),
    AudioFormat("opus", "audio/ogg; codecs=opus", ".opus", False, "OGG", "OPUS"),
    AudioFormat("ogg", "audio/ogg; codecs=vorbis", ".ogg", False, "OGG", "VORBIS"),
)}
WAV = FORMATS["wav"]  # what the export writes and the web UI plays


def audio_format(name: str) -> AudioFormat:
    """The format called `name`; a ValueError naming `fmt` (and the choices) for any other."""
    if name not in FORMATS:
        raise ValueError(f"fmt: unsupported audio format {name!r}; choose one of {list(FORMATS)}")
    return FORMATS[name]


def available_formats() -> tuple[str, ...]:
    """The formats this install can encode: wav and pcm always, the others when libsndfile has their codec."""
    import soundfile as sf

    have = sf.available_formats()

    def can_encode(f: AudioFormat) -> bool:
        return f.container is None or (f.container in have and f.subtype in sf.available_subtypes(f.container))

    return tuple(name for name, f in FORMATS.items() if can_encode(f))
