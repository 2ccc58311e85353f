"""Serving stage: OpenAI `voice` and `speed` fields -> ChatTTS speaker strings and `[speed_N]` prompts.

A voice is a preset name (a bookmark for an audio seed), an integer seed, a saved voice (text.voices.VoiceLibrary)
or a speaker string from `Chat.sample_random_speaker()`. The same name or seed gives the same voice on every run
and machine; text.voices.voice_params decides which is which.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable

from ..text import decode_spk_emb
from ..text.speaker import VOICE_SEED_MAX
from ..text.voices import PRESET_SEEDS, VoiceLibrary, is_seed_text, voice_params

SPEED_RANGE = (0.25, 4.0)


def speed_prompt(speed: float) -> str:
    """OpenAI speed (0.25-4.0, 1.0 normal) -> ChatTTS `[speed_N]`, N = 0..9 with 5 normal.

    N = 5 + 2.5 * log2(speed), rounded and clipped: 0.5 -> 2, 0.75 -> 4, 1.0 -> 5, 1.5 -> 6, 2.0 -> 8, >= 2.6 -> 9.
    """
    low, high = SPEED_RANGE
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not low <= speed <= high:
        raise ValueError(f"speed: must be a number in [{low}, {high}] (1.0 is normal), got {speed!r}")
    return f"[speed_{min(9, max(0, round(5 + 2.5 * math.log2(speed))))}]"


class VoiceBook:
    """Speaker strings for voice names, seeds or strings; a seed's speaker is drawn once and cached."""

    def __init__(self, sample_speaker: Callable[..., str], hidden_size: int, library: VoiceLibrary | None = None,
                 cache_size: int = 1024) -> None:
        self.sample_speaker, self.hidden_size, self.library = sample_speaker, hidden_size, library
        self.presets = dict(PRESET_SEEDS)
        self.cache_size = cache_size
        self._by_seed: OrderedDict[int, str] = OrderedDict()
        self._lock = threading.Lock()

    def names(self) -> list[dict]:
        return [{"id": name, "name": name, "seed": seed} for name, seed in self.presets.items()]

    def params(self, voice: object) -> dict[str, str | None]:
        """InferCodeParams keywords {spk_emb, spk_smp, txt_smp} for voice; ValueError naming `voice` otherwise."""
        drawn = []  # a seed's speaker comes from this model; strings and saved voices are checked against it

        def for_seed(seed: int) -> str:
            drawn.append(seed)
            return self.for_seed(seed)

        found = voice_params(voice, self.library, for_seed)
        if found["spk_emb"] is not None and not drawn:
            self.check_speaker(found["spk_emb"])
        return found

    def kind(self, voice: object) -> str:
        """The metrics label of a voice params() accepted: preset, seed, saved, clone (a saved clip) or speaker."""
        voice = voice.get("id") if isinstance(voice, dict) else voice
        if voice is None or (isinstance(voice, str) and voice.strip().lower() in self.presets):
            return "preset"
        if isinstance(voice, int) or is_seed_text(voice):
            return "seed"
        if self.library is not None and voice in self.library:
            return "clone" if self.library.get(voice).clip_code else "saved"
        return "speaker"

    def resolve(self, voice: object) -> str | None:
        """The speaker string for voice (None -> "default"; None for a saved voice that is a clip only)."""
        return self.params(voice)["spk_emb"]

    def for_seed(self, seed: int) -> str:
        if not 0 <= seed <= VOICE_SEED_MAX:
            raise ValueError(f"voice: a seed must be in 0..{VOICE_SEED_MAX}, got {seed}")
        with self._lock:  # requests resolve voices on several text threads at once
            if seed not in self._by_seed:
                self._by_seed[seed] = self.sample_speaker(seed=seed)  # its own generator: the global RNG is shared
                if len(self._by_seed) > self.cache_size:
                    self._by_seed.popitem(last=False)
            self._by_seed.move_to_end(seed)
            return self._by_seed[seed]

    def check_speaker(self, speaker: str, field: str = "voice") -> None:
        """A speaker string this model can use; ValueError naming `field` otherwise."""
        try:
            width = decode_spk_emb(speaker).numel()
        except ValueError as exc:
            raise ValueError(f"{field}: {str(exc).split(': ', 1)[-1]}") from None
        if width != self.hidden_size:
            raise ValueError(f"{field}: the speaker string holds {width} values but this model needs "
                             f"{self.hidden_size}; sample it from this model")
