"""Text stage: named voices. A voice is a speaker string, an audio prompt (clip codes + transcript), or both.

`VoiceLibrary` keeps one JSON file per voice under a folder (atomic writes, safe names, size limits), so voices
survive restarts and are shared by the server, the web UI and the export. `voice_params` is the one place that
turns what a user calls a voice (preset, seed, saved name, {"id": name}, speaker string) into InferCodeParams'
(spk_emb, spk_smp, txt_smp).
"""
from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypedDict

from chattts_velocity.text.blend import blend_speaker, is_blend
from chattts_velocity.text.speaker import (
    MAX_CLIP_CHARS,
    MAX_SPEAKER_CHARS,
    VOICE_SEED_MAX,
    decode_prompt,
    decode_spk_emb,
)

logger = logging.getLogger("chattts_velocity.voices")
VOICES_ENV = "CHATTTS_VELOCITY_VOICES"
# preset name -> audio seed. OpenAI's 13 voice names (the openai client's `Voice` type) are accepted so stock
# clients work; the names promise nothing about the timbre. "default" matches the web UI's Default (seed 2).
PRESET_SEEDS = {
    "default": 2, "alloy": 1111, "ash": 2222, "ballad": 3333, "coral": 4444, "echo": 5555, "fable": 6666,
    "onyx": 7777, "nova": 8888, "sage": 9999, "shimmer": 1234, "verse": 4321, "marin": 2468, "cedar": 1357,
}
# letters, digits, space, "_", "-", "."; starts with a letter or digit (no hidden files, no ".."), <= 64 chars
_SEED_TEXT = re.compile(r"[0-9]+")
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_. -]{0,63}")
MAX_TRANSCRIPT_CHARS = 2000


class VoiceFields(TypedDict):
    """InferCodeParams' speaker keywords: what a voice speaks with."""

    spk_emb: str | None
    spk_smp: str | None
    txt_smp: str | None


class VoiceExists(ValueError):
    """save() without overwrite on a name the library holds (HTTP 409)."""


class UnknownVoice(ValueError):
    """get() or delete() of a name the library does not hold (HTTP 404)."""


@dataclass(frozen=True)
class Voice:
    name: str
    speaker: str | None  # spk_emb speaker string (Chat.sample_random_speaker format)
    clip_code: str | None  # spk_smp from Chat.sample_audio_speaker(clip)
    transcript: str | None  # txt_smp: the words spoken in the clip (needed with clip_code)
    created: float

    def params(self) -> VoiceFields:
        """InferCodeParams keywords that speak with this voice."""
        return {"spk_emb": self.speaker, "spk_smp": self.clip_code, "txt_smp": self.transcript}


def default_root() -> Path:
    """$CHATTTS_VELOCITY_VOICES, else ~/.cache/chattts_velocity/voices."""
    env = os.environ.get(VOICES_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "chattts_velocity" / "voices"


def check_name(name: object) -> str:
    """A usable voice name (stripped); ValueError naming `name` otherwise."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name.strip()):
        raise ValueError(f"name: {str(name)[:80]!r} is not a voice name; use 1-64 letters, digits, spaces, '_', "
                         "'-' or '.', starting with a letter or digit")
    name = name.strip()
    if name.lower() in PRESET_SEEDS or name.isdigit():
        raise ValueError(f"name: {name!r} is taken by a preset voice or a seed; choose another name")
    return name


def check_voice_fields(speaker: object, clip_code: object, transcript: object) -> None:
    """What a voice holds must be usable: ValueError naming `speaker`, `clip_code` or `transcript` otherwise."""
    if speaker is None and clip_code is None:
        raise ValueError("speaker: give a speaker string, a clip code (with its transcript), or both")
    _check_string("speaker", speaker, MAX_SPEAKER_CHARS, decode_spk_emb)
    _check_string("clip_code", clip_code, MAX_CLIP_CHARS, decode_prompt)
    if clip_code is not None and not (isinstance(transcript, str) and transcript.strip()):
        raise ValueError("transcript: a clip code needs the words spoken in the clip")
    if transcript is not None and clip_code is None:
        raise ValueError("transcript: given without a clip_code; the transcript belongs to a clip")
    if transcript is not None and (not isinstance(transcript, str) or len(transcript) > MAX_TRANSCRIPT_CHARS):
        raise ValueError(f"transcript: must be a string of at most {MAX_TRANSCRIPT_CHARS} characters")


def _check_string(field: str, value: object, limit: int, decode: Callable[[str], object]) -> None:
    if value is None:
        return
    if not isinstance(value, str) or len(value) > limit:
        raise ValueError(f"{field}: must be a string of at most {limit} characters")
    try:
        decode(value)
    except ValueError as exc:  # the decoders name upstream's fields (speaker / spk_smp); ours is `field`
        raise ValueError(f"{field}: {str(exc).split(': ', 1)[-1]}") from None


class VoiceLibrary:
    """Named voices on disk, one `<name lower-cased>.json` each; safe to share between threads and processes."""

    def __init__(self, root: str | Path | None = None, max_voices: int = 1000) -> None:
        if isinstance(max_voices, bool) or not isinstance(max_voices, int) or max_voices < 1:
            raise ValueError(f"max_voices: must be an integer >= 1, got {max_voices!r}")
        self.root = Path(root).expanduser() if root is not None else default_root()
        self.max_voices = max_voices
        self._lock = threading.Lock()

    def save(self, name: str, *, speaker: str | None = None, clip_code: str | None = None,
             transcript: str | None = None, overwrite: bool = False) -> Voice:
        name = check_name(name)
        check_voice_fields(speaker, clip_code, transcript)
        voice = Voice(name, speaker, clip_code, transcript, time.time())
        with self._lock:
            self.root.mkdir(parents=True, exist_ok=True)
            path = self._path(name)
            if not path.exists() and len(self._files()) >= self.max_voices:
                raise ValueError(f"name: the library holds its limit of {self.max_voices} voices; delete one first")
            self._write(path, voice, overwrite)
        return voice

    def get(self, name: str) -> Voice:
        path = self._known(name)
        try:
            return _read(path)
        except FileNotFoundError:
            raise UnknownVoice(f"voice: no saved voice named {name!r}") from None

    def list(self) -> list[Voice]:
        voices = []
        for path in self._files():
            try:
                voices.append(_read(path))
            except (OSError, ValueError) as exc:  # a damaged file hides one voice, not the library
                logger.warning("voice library: skipping %s (%s)", path, exc)
        return sorted(voices, key=lambda v: v.name.lower())

    def delete(self, name: str) -> None:
        path = self._known(name)
        with self._lock:
            try:
                path.unlink()
            except FileNotFoundError:
                raise UnknownVoice(f"voice: no saved voice named {name!r}") from None

    def __contains__(self, name: object) -> bool:
        try:
            return self._known(name).exists()
        except ValueError:
            return False

    def _known(self, name: object) -> Path:
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name.strip()):
            raise UnknownVoice(f"voice: no saved voice named {str(name)[:80]!r}")
        return self._path(name.strip())

    def _path(self, name: str) -> Path:
        return self.root / f"{name.lower()}.json"  # names are case-insensitively unique

    def _files(self) -> Sequence[Path]:  # (`list` here is the method above)
        return sorted(self.root.glob("*.json")) if self.root.is_dir() else []

    def _write(self, path: Path, voice: Voice, overwrite: bool) -> None:
        """Write a temp file and rename it in: readers see the old voice or the new one, never half of one."""
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-", suffix=".part")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(asdict(voice), f, ensure_ascii=False)
                f.flush()
                os.fsync(f.fileno())
            if overwrite:
                os.replace(tmp, path)
            else:
                _link_new(tmp, path, voice.name)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _link_new(tmp: str, path: Path, name: str) -> None:
    """Create `path` only if no voice has it (atomic across processes too)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise VoiceExists(f"name: a voice named {name!r} exists; delete it or save with overwrite") from None


def _read(path: Path) -> Voice:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or set(data) != set(Voice.__dataclass_fields__):
        raise ValueError(f"{path.name} is not a voice file")
    return Voice(**data)


def voice_params(voice: object, library: VoiceLibrary | None,
                 speaker_for_seed: Callable[[int], str]) -> VoiceFields:
    """A voice as users give it -> InferCodeParams keywords {spk_emb, spk_smp, txt_smp}.

    Accepted: None (the "default" preset), {"id": name} (OpenAI's object form), a preset name or an integer seed
    (speaker_for_seed draws its speaker), a saved voice's name, a speaker string, or a blend of those
    (text/blend.py: "alloy(2)+1234(1)"). ValueError naming `voice`.
    """
    if isinstance(voice, dict):
        voice = voice.get("id") if set(voice) == {"id"} else None
        if not isinstance(voice, str):
            raise ValueError('voice: the object form is {"id": "<voice name>"}')
    voice = "default" if voice is None else voice
    if isinstance(voice, bool) or not isinstance(voice, (str, int)):
        raise ValueError(f"voice: expected a voice name, a seed or a speaker string, got {voice!r}")
    if isinstance(voice, int) or is_seed_text(voice):
        return _speaker_only(speaker_for_seed(_seed(voice)))
    if is_blend(voice):
        return _speaker_only(blend_speaker(voice, lambda part: voice_params(part, library,
                                                                            speaker_for_seed)["spk_emb"]))
    if voice.strip().lower() in PRESET_SEEDS:
        return _speaker_only(speaker_for_seed(PRESET_SEEDS[voice.strip().lower()]))
    if library is not None and voice in library:
        return library.get(voice).params()
    if _is_speaker(voice):
        return _speaker_only(voice)
    raise ValueError(f"voice: unknown voice {voice[:40]!r}; use a saved voice, one of {sorted(PRESET_SEEDS)}, an "
                     "integer seed, a speaker string from sample_random_speaker() (GET /v1/audio/voices), or a blend "
                     "of those such as alloy(2)+1234(1)")


def check_voice_seed(seed: int) -> int:
    """A seed voice's seed (0..VOICE_SEED_MAX); the ValueError names `voice`, as everywhere a voice is given."""
    if not 0 <= seed <= VOICE_SEED_MAX:
        raise ValueError(f"voice: a seed must be in 0..{VOICE_SEED_MAX}, got {seed}")
    return seed


def is_seed_text(voice: str) -> bool:
    """An integer seed written as text: ASCII digits only ("²" and "٣" are digits to str.isdigit, not to int)."""
    return _SEED_TEXT.fullmatch(voice.strip()) is not None


def _seed(voice: int | str) -> int:
    if isinstance(voice, str) and len(voice.strip()) > len(str(VOICE_SEED_MAX)):
        raise ValueError(f"voice: a seed must be in 0..{VOICE_SEED_MAX}, got {len(voice.strip())} digits")
    return int(voice)


def _is_speaker(voice: str) -> bool:
    try:
        decode_spk_emb(voice)
    except ValueError:
        return False
    return True


def _speaker_only(speaker: str) -> VoiceFields:
    return {"spk_emb": speaker, "spk_smp": None, "txt_smp": None}
