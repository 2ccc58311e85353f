"""Text stage: voice blends. `alloy(2)+1234(1)` -> one speaker vector, a weighted mix of its parts' vectors.

A blend is 1..MAX_BLEND_PARTS parts joined by "+"; a part is any voice text.voices.voice_params resolves to a speaker
vector (a preset, a seed, a saved voice with a speaker string, a speaker string), optionally followed by its weight in
parentheses (default 1). None of those holds "+", "(" or ")", so a voice holding one of them is a blend.

The mix: weights w_i scaled to sum 1, parts with the same speaker merged (their weights added), then

    x = mean + sum_i w_i * (x_i - mean) / sqrt(sum_i w_i**2)

with `mean` the model's speaker statistics (text/res/spk_stat.npy, the mean random speakers are drawn around; zero
for a speaker wider than those statistics). Random speakers are `mean + std * z`; the division keeps a mix of
independent random speakers exactly as spread around the mean as one random speaker, instead of drifting towards the
average voice as a plain weighted average would. One distinct part is that voice unchanged. The sum runs in float32
in the parts' order on the CPU and is stored as float16 (a speaker string): the same blend text gives the same
speaker string, bit for bit, on every run and machine.
"""
from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from chattts_velocity.text.speaker import decode_spk_emb, encode_spk_emb, speaker_stats

MAX_BLEND_PARTS = 4
MAX_BLEND_WEIGHT = 1000.0  # weights only count relative to each other; a bound keeps the text short and sane
_PART = re.compile(r"\s*([^()+]*?)\s*(?:\(\s*([^()]*?)\s*\))?\s*")
_WEIGHT = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)")
_BLEND_MARKS = re.compile(r"[+()]")


@dataclass(frozen=True)
class BlendPart:
    voice: str  # a voice as voice_params takes it (never itself a blend)
    weight: float  # > 0, as written (blend_speaker scales the weights to sum 1)


def is_blend(voice: str) -> bool:
    """Whether a voice text is a blend (it holds "+", "(" or ")": no voice name, seed or speaker string does)."""
    return _BLEND_MARKS.search(voice) is not None


def parse_blend(voice: str) -> list[BlendPart]:
    """`alloy(2)+1234` -> [BlendPart("alloy", 2.0), BlendPart("1234", 1.0)]; a ValueError naming `voice` otherwise."""
    texts = voice.split("+")
    if len(texts) > MAX_BLEND_PARTS:
        raise ValueError(f"voice: a blend has at most {MAX_BLEND_PARTS} parts, got {len(texts)}")
    parts = []
    for text in texts:
        match = _PART.fullmatch(text)
        if match is None or not match.group(1):
            raise ValueError(f"voice: {text.strip()[:40]!r} is not a blend part; write NAME or NAME(WEIGHT) joined "
                             "by '+', e.g. alloy(2)+1234(1)")
        parts.append(BlendPart(match.group(1), _weight(match.group(1), match.group(2))))
    return parts


def _weight(name: str, text: str | None) -> float:
    if text is None:
        return 1.0
    weight = float(text) if _WEIGHT.fullmatch(text) else math.nan
    if not 0 < weight <= MAX_BLEND_WEIGHT:  # NaN fails too
        raise ValueError(f"voice: the weight of {name[:40]!r} must be a number > 0 and <= {MAX_BLEND_WEIGHT:g}, got "
                         f"{text[:20]!r}")
    return weight


def blend_speaker(voice: str, speaker_of: Callable[[str], str | None]) -> str:
    """A blend's speaker string. `speaker_of(part)` is the part's speaker string (None: the voice has none, e.g. a
    voice cloned from a clip) or a ValueError; every error names `voice` and the part."""
    speakers: dict[str, float] = {}  # speaker string -> summed weight, in first-seen order
    for part in parse_blend(voice):
        try:
            speaker = speaker_of(part.voice)
        except ValueError as exc:
            raise ValueError(f"voice: blend part {part.voice[:40]!r}: {str(exc).split(': ', 1)[-1]}") from None
        if speaker is None:
            raise ValueError(f"voice: blend part {part.voice[:40]!r} has no speaker vector (a voice cloned from a clip "
                             "does not blend); use presets, seeds, speaker strings or saved speakers")
        speakers[speaker] = speakers.get(speaker, 0.0) + part.weight
    if len(speakers) == 1:
        return next(iter(speakers))
    return _mix(tuple(speakers.items()))


@functools.lru_cache(maxsize=256)
def _mix(parts: tuple[tuple[str, float], ...]) -> str:
    vectors = [decode_spk_emb(speaker, "voice").float() for speaker, _ in parts]  # each [D]
    widths = {len(v) for v in vectors}
    if len(widths) != 1:
        raise ValueError(f"voice: the blend's parts have different widths {sorted(widths)}; blend voices of one model")
    total = sum(weight for _, weight in parts)
    weights = [weight / total for _, weight in parts]
    mean = _speaker_mean(len(vectors[0]))
    deviation = torch.zeros_like(mean)
    for weight, vector in zip(weights, vectors, strict=True):
        deviation += weight * (vector - mean)
    spread = math.sqrt(sum(w * w for w in weights))
    return encode_spk_emb(mean + deviation / spread)


def _speaker_mean(dim: int) -> torch.Tensor:
    """The statistics' mean [dim] in float32 (zeros past their width: no statistics to match there)."""
    try:
        return speaker_stats(dim)[1].float()
    except ValueError:
        return torch.zeros(dim)
