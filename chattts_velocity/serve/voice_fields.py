"""Serving stage: OpenAI `voice` and `speed` fields -> ChatTTS speaker strings and `[speed_N]` prompts.

A voice is a preset name (a bookmark for an audio seed), an integer seed, a saved voice (text.voices.VoiceLibrary),
a speaker string from `Chat.sample_random_speaker()`, or a blend of those (text/blend.py). The same name, seed or
blend gives the same voice on every run and machine; text.voices.voice_params decides which is which. Whether a
speaker string fits the model is the pipeline's text front end's check, made when the request is built.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable

from ..text.blend import is_blend
from ..text.controls import CONTROL_LEVELS, DEFAULT_LEVELS, control_token
from ..text.voices import PRESET_SEEDS, VoiceFields, VoiceLibrary, check_voice_seed, is_seed_text, voice_params

SPEED_RANGE = (0.25, 4.0)


def speed_prompt(speed: float) -> str:
    """OpenAI speed (0.25-4.0, 1.0 normal) -> ChatTTS `[speed_N]`, N = 0..9 with the default level (5) normal.

    N = 5 + 2.5 * log2(speed), rounded and clipped: 0.5 -> 2, 0.75 -> 4, 1.0 -> 5, 1.5 -> 6, 2.0 -> 8, >= 2.6 -> 9.
    """
    low, high = SPEED_RANGE
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not low <= speed <= high:
        raise ValueError(f"speed: must be a number in [{low}, {high}] (1.0 is normal), got {speed!r}")
    level = round(DEFAULT_LEVELS["speed"] + 2.5 * math.log2(speed))
    return control_token("speed", min(CONTROL_LEVELS["speed"], max(0, level)))


class VoiceBook:
    """Speaker strings for voice names, seeds or strings; a seed's speaker is drawn once and cached."""

    def __init__(self, sample_speaker: Callable[..., str], library: VoiceLibrary | None = None,
                 cache_size: int = 1024) -> None:
        self.sample_speaker, self.library = sample_speaker, library
        self.presets = dict(PRESET_SEEDS)
        self.cache_size = cache_size
        self._by_seed: OrderedDict[int, str] = OrderedDict()
        self._lock = threading.Lock()

    def names(self) -> list[dict[str, str | int]]:
        return [{"id": name, "name": name, "seed": seed} for name, seed in self.presets.items()]

    def params(self, voice: object) -> VoiceFields:
        """InferCodeParams keywords {spk_emb, spk_smp, txt_smp} for voice; ValueError naming `voice` otherwise."""
        return voice_params(voice, self.library, self.for_seed)

    def kind(self, voice: object) -> str:
        """The metrics label of a voice params() accepted: preset, seed, saved, clone (a saved clip), blend or
        speaker."""
        voice = voice.get("id") if isinstance(voice, dict) else voice
        if isinstance(voice, str) and is_blend(voice):
            return "blend"
        if voice is None or (isinstance(voice, str) and voice.strip().lower() in self.presets):
            return "preset"
        if isinstance(voice, int) or (isinstance(voice, str) and is_seed_text(voice)):
            return "seed"
        if self.library is not None and isinstance(voice, str) and voice in self.library:
            return "clone" if self.library.get(voice).clip_code else "saved"
        return "speaker"

    def resolve(self, voice: object) -> str | None:
        """The speaker string for voice (None -> "default"; None for a saved voice that is a clip only)."""
        return self.params(voice)["spk_emb"]

    def for_seed(self, seed: int) -> str:
        check_voice_seed(seed)
        with self._lock:  # requests resolve voices on several text threads at once
            if seed not in self._by_seed:
                self._by_seed[seed] = self.sample_speaker(seed=seed)  # its own generator: the global RNG is shared
                if len(self._by_seed) > self.cache_size:
                    self._by_seed.popitem(last=False)
            self._by_seed.move_to_end(seed)
            return self._by_seed[seed]
