"""The model's voices: a random draw, a voice clip's codes, and the check that a speaker string fits this model.

`SpeechPipeline.speakers` is the one place callers (Chat, the server's voice routes, the web UI, the export) get
voices from; the width check is the text front end's, so a voice saved here is one every job accepts.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..audio import DVAE, load_clip
from ..audio.wav import SAMPLE_RATE
from ..text import encode_prompt, sample_random_speaker
from .calls import CallGate
from .frontend import TextFrontEnd


class Speakers:
    """Voices for one loaded model: its GPT's width (the front end's), its DVAE, its device and call gate."""

    def __init__(self, frontend: TextFrontEnd, dvae: DVAE, device: torch.device, gate: CallGate) -> None:
        self.frontend, self.dvae, self.device, self.gate = frontend, dvae, device, gate

    def random(self, seed: int | None = None) -> str:
        """A random voice (upstream's draw); with `seed`, the voice torch.manual_seed(seed) would give, drawn
        without touching the global RNG."""
        return sample_random_speaker(self.frontend.hidden_size, device=self.device, seed=seed)

    def from_audio(self, wav: np.ndarray | torch.Tensor | str | Path, sample_rate: int = SAMPLE_RATE) -> str:
        """Encode a 24 kHz mono clip (array or audio file path) into an spk_smp string, in its turn at the model
        (the DVAE is the model's: one call at a time)."""
        clip = load_clip(wav, sample_rate, expected_rate=SAMPLE_RATE)
        with self.gate.call(), torch.inference_mode():
            codes = self.dvae.encode(clip.to(self.device))  # [4, T]
        return encode_prompt(codes.cpu())

    def check(self, speaker: str | torch.Tensor, field: str = "speaker") -> None:
        """A ValueError naming `field` unless this model can use the speaker (it decodes, has the GPT's width and
        sane values)."""
        self.frontend.speaker(speaker, field)
