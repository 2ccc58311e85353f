"""Web UI control values -> ChatTTS prompt tags, voice preset names and the download file.

Kept free of gradio so the mapping from a slider to what the model sees is tested without a browser.
"""
from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chattts_velocity.audio import SAMPLE_RATE, wav_bytes
from chattts_velocity.audio.formats import audio_format
from chattts_velocity.schema import check_sampling
from chattts_velocity.text.controls import CONTROL_LEVELS, DEFAULT_LEVELS, control_token
from chattts_velocity.text.voices import PRESET_SEEDS

# The voice presets are the server's (PRESET_SEEDS, name -> audio seed): the same name is the same voice on the
# page and through the API.
DEFAULT_PRESET = "default"
CUSTOM = "Custom"  # the preset shown for a seed no preset names (a dice roll, a typed seed)

# control -> (highest level, default), the sliders' ranges: the tokenizer's, and upstream's defaults
LEVELS = {name: (high, DEFAULT_LEVELS[name]) for name, high in CONTROL_LEVELS.items()}
BATCH_SIZE = (1, 16, 4)  # (lowest, highest, default) pieces per batch when long text is split


@dataclass(frozen=True)
class Request:
    """The Generate inputs, in the order the UI passes them."""

    text: str
    speaker: str
    clip_code: str
    transcript: str
    refine: bool
    oral: float
    laugh: float
    pause: float  # the [break_N] level
    refine_beams: float  # 1: the refine pass samples; 2..params.SHARED_MAX_BEAMS: beam search (the most likely text)
    text_seed: float
    audio_seed: float
    speed: float
    temperature: float
    top_p: float
    top_k: float
    split_text: bool
    batch_size: float
    fmt: str  # the download's format, a name from audio.formats.available_formats()
    captions: str = "none"  # "srt" or "vtt": the caption file beside the download (webui/scripts.py)


def whole(value: float | None, field: str, low: int, high: int) -> int:
    """A slider or number box value (gradio gives floats) as an int in [low, high]; else ValueError naming field."""
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value)
                                       and value == int(value) and low <= value <= high):
        raise ValueError(f"{field}: must be a whole number from {low} to {high}, got {value!r}")
    return int(value)


def level(value: float | None, control: str) -> int:
    return whole(value, control, 0, LEVELS[control][0])


def speed_prompt(speed: float) -> str:
    """The code-pass prompt (InferCodeParams.prompt) for a speed level."""
    return control_token("speed", level(speed, "speed"))


def refine_prompt(oral: float, laugh: float, pause: float) -> str:
    """The refine-pass prompt (RefineTextParams.prompt): how chatty, how many laughs, how many breaks."""
    return "".join(control_token(name, level(value, name))
                   for name, value in (("oral", oral), ("laugh", laugh), ("break", pause)))


def batch_size(value: float) -> int:
    low, high, _ = BATCH_SIZE
    return whole(value, "batch size", low, high)


def preset_for_seed(seed: float | None) -> str:
    """The preset whose seed this is, else CUSTOM: the dropdown follows the seed box."""
    return next((name for name, s in PRESET_SEEDS.items() if s == seed), CUSTOM)


def write_download(wav: np.ndarray, fmt: str, folder: str | Path) -> Path:
    """Encode a float32 24 kHz waveform as fmt into a fresh subfolder of folder -> speech.<ext>.

    One subfolder per run: every download keeps the readable name and none overwrites another.
    """
    spec = audio_format(fmt)
    path = Path(tempfile.mkdtemp(dir=folder)) / f"speech{spec.extension}"
    path.write_bytes(wav_bytes(wav, SAMPLE_RATE, fmt))
    return path


def check_seed(value: float | None, field: str) -> int:
    """A seed box's value (gradio gives floats) as an int, under the library's one seed rule."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value == int(value)):
        raise ValueError(f"{field}: must be a whole number, got {value!r}")
    check_sampling({"seed": int(value)}, {"seed": field})
    return int(value)
