"""Serving stage: OpenAI `voice` and `speed` fields -> ChatTTS speaker strings and `[speed_N]` prompts.

A voice is a preset name (a bookmark for an audio seed), an integer seed, or a speaker string from
`Chat.sample_random_speaker()`. The same name or seed gives the same voice on every run and machine.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable

from ..text import decode_spk_emb, seed_context
from ..text.speaker import SPEAKER_PREFIX, VOICE_SEED_MAX

# name -> audio seed. OpenAI's voice names are accepted so stock clients work; the names promise nothing
# about the timbre. "default" matches the web UI's Default (seed 2).
VOICE_SEEDS = {
    "default": 2, "alloy": 1111, "ash": 2222, "ballad": 3333, "coral": 4444, "echo": 5555, "fable": 6666,
    "onyx": 7777, "nova": 8888, "sage": 9999, "shimmer": 1234, "verse": 4321,
}
SPEED_RANGE = (0.25, 4.0)


def speed_prompt(speed: float) -> str:
    """OpenAI speed (0.25-4.0, 1.0 normal) -> ChatTTS `[speed_N]`, N = 0..9 with 5 normal.

    N = 5 + 2.5 * log2(speed), rounded and clipped: 0.5 -> 2, 0.75 -> 4, 1.0 -> 5, 1.5 -> 6, 2.0 -> 8, >= 2.6 -> 9.
    """
    low, high = SPEED_RANGE
    if not isinstance(speed, (int, float)) or not low <= speed <= high:
        raise ValueError(f"speed: must be a number in [{low}, {high}] (1.0 is normal), got {speed!r}")
    return f"[speed_{min(9, max(0, round(5 + 2.5 * math.log2(speed))))}]"


class VoiceBook:
    """Speaker strings for voice names, seeds or strings; a seed's speaker is drawn once and cached."""

    def __init__(self, sample_speaker: Callable[[], str], hidden_size: int, presets: dict[str, int] | None = None,
                 cache_size: int = 1024) -> None:
        self.sample_speaker, self.hidden_size = sample_speaker, hidden_size
        self.presets = dict(VOICE_SEEDS if presets is None else presets)
        self.cache_size = cache_size
        self._by_seed: OrderedDict[int, str] = OrderedDict()

    def names(self) -> list[dict]:
        return [{"id": name, "name": name, "seed": seed} for name, seed in self.presets.items()]

    def resolve(self, voice: str | int | None) -> str:
        """The speaker string for voice (None -> "default"); ValueError naming `voice` otherwise."""
        if voice is None:
            voice = "default"
        if isinstance(voice, bool) or not isinstance(voice, (str, int)):
            raise ValueError(f"voice: expected a preset name, a seed or a speaker string, got {voice!r}")
        if isinstance(voice, int) or voice.strip().isdigit():
            return self.for_seed(int(voice))
        if voice.lower() in self.presets:
            return self.for_seed(self.presets[voice.lower()])
        if voice.startswith(SPEAKER_PREFIX):
            return self._checked_string(voice)
        raise ValueError(f"voice: unknown voice {voice[:40]!r}; use one of {sorted(self.presets)}, an integer "
                         f"seed, or a speaker string from sample_random_speaker() (GET /v1/audio/voices)")

    def for_seed(self, seed: int) -> str:
        if not 0 <= seed <= VOICE_SEED_MAX:
            raise ValueError(f"voice: a seed must be in 0..{VOICE_SEED_MAX}, got {seed}")
        if seed not in self._by_seed:
            with seed_context(seed):
                self._by_seed[seed] = self.sample_speaker()
            if len(self._by_seed) > self.cache_size:
                self._by_seed.popitem(last=False)
        self._by_seed.move_to_end(seed)
        return self._by_seed[seed]

    def _checked_string(self, voice: str) -> str:
        width = decode_spk_emb(voice).numel()  # ValueError names "speaker" for malformed strings
        if width != self.hidden_size:
            raise ValueError(f"voice: the speaker string holds {width} values but this model needs "
                             f"{self.hidden_size}; sample it from this model")
        return voice
