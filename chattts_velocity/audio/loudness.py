"""Audio stage: loudness normalisation of a finished clip to a target integrated loudness (ITU-R BS.1770 / EBU R128,
measured by pyloudnorm)."""
from __future__ import annotations

import math

import numpy as np

from .wav import SAMPLE_RATE

LOUDNESS_RANGE = (-70.0, -5.0)  # LUFS a request may ask for; speech platforms use -23 to -14
PEAK_LIMIT = 0.999  # the gain is lowered rather than letting a sample clip (the clip is then quieter than asked)
MIN_SECONDS = 0.4  # BS.1770 gates 400 ms blocks: shorter clips have no measurable loudness


def check_loudness(target: object, field: str = "loudness") -> float:
    """A usable LUFS target; ValueError naming `field` otherwise."""
    low, high = LOUDNESS_RANGE
    # compared before any float() (an integer of 310 digits overflows one); NaN and inf fail the comparison too
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not low <= target <= high:
        raise ValueError(f"{field}: a target loudness in LUFS between {low:g} and {high:g} (e.g. -16), got "
                         f"{str(target)[:40]}")
    return float(target)


def normalize_loudness(wav: np.ndarray, target: float, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """wav scaled to `target` LUFS (peak-limited to PEAK_LIMIT); silent or too short clips come back unchanged."""
    import pyloudnorm

    if len(wav) < MIN_SECONDS * sample_rate or not np.any(wav):
        return wav
    measured = pyloudnorm.Meter(sample_rate).integrated_loudness(wav.astype(np.float64))
    if not math.isfinite(measured):  # everything below the absolute gate (-70 LUFS)
        return wav
    gain = 10.0 ** ((target - measured) / 20.0)
    peak = float(np.abs(wav).max())
    gain = min(gain, PEAK_LIMIT / peak)
    normalised: np.ndarray = (wav * gain).astype(np.float32)
    return normalised
