"""Where the mel frames come from: the Decoder on the GPT's hidden states, or the DVAE on its audio codes.

A `MelSource` is chosen once per call at the public edges (Chat's and the server's upstream-style flag, the CLI's)
and carries every fact that follows from the choice: whether the GPT must return hidden states, the rows
[n, C] a stream decodes (and their width C), the batch decode, and the modules with their autocast precision.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import numpy as np
import torch

from ..audio import DVAE, Decoder, StreamDecoder, Vocos, cast_for_autocast, decode_codes_batch, decode_hidden_batch
from ..audio.streaming import row_width
from ..precision import Precision
from ..schema import GenerationOutput

MEL_SOURCES = ("decoder", "dvae")  # the names MelSource.name takes


class MelSource:
    """A mel model and Vocos, already cast for the precision's audio dtype (None: exact float32; bf16: autocast on
    their device). Build both with `mel_sources`."""

    name: ClassVar[str]
    return_hidden: ClassVar[bool]  # what the GPT must return for this source

    def __init__(self, model: Decoder | DVAE, vocos: Vocos, precision: Precision) -> None:
        self.model, self.vocos, self.precision = model, vocos, precision

    @property
    def dtype(self) -> torch.dtype | None:
        """The decode's autocast dtype (precision.audio; None: exact float32)."""
        return self.precision.audio

    @property
    def row_width(self) -> int:
        """C of the rows [n, C] this source decodes (the GPT's hidden size, or the 4 codebooks)."""
        return row_width(self.model)

    def rows(self, output: GenerationOutput) -> torch.Tensor:  # -> [n, C]
        raise NotImplementedError

    def decode(self, outputs: list[GenerationOutput]) -> list[np.ndarray]:
        """Whole outputs -> float32 24 kHz waveforms of (2T - 1) * 256 samples each (audio/decode.py)."""
        raise NotImplementedError

    def stream_decoder(self, chunk_steps: int = 24, left_context_steps: int | None = None,
                       lookahead_steps: int | None = None) -> StreamDecoder:
        return StreamDecoder(self.model, self.vocos, chunk_steps, left_context_steps, lookahead_steps)

    @contextmanager
    def autocast(self) -> Iterator[None]:
        """The precision the modules were cast for, on their device (a no-op for float32)."""
        device = self.vocos.head.istft.window.device.type
        with torch.autocast(device, dtype=self.dtype or torch.float32, enabled=self.dtype not in (None, torch.float32)):
            yield


class DecoderSource(MelSource):
    """The Decoder on the hidden states that predicted each step's codes (upstream's default)."""

    name, return_hidden = "decoder", True
    model: Decoder

    def rows(self, output: GenerationOutput) -> torch.Tensor:
        if output.hidden is None:
            raise ValueError("hidden: the GPT returned no hidden states; build the requests with this source's "
                             "return_hidden")
        return output.hidden

    def decode(self, outputs: list[GenerationOutput]) -> list[np.ndarray]:
        return decode_hidden_batch(self.model, self.vocos, [self.rows(o) for o in outputs], self.dtype)


class DVAESource(MelSource):
    """The DVAE's decoder on the sampled audio codes."""

    name, return_hidden = "dvae", False
    model: DVAE

    def rows(self, output: GenerationOutput) -> torch.Tensor:
        return output.token_ids

    def decode(self, outputs: list[GenerationOutput]) -> list[np.ndarray]:
        return decode_codes_batch(self.model, self.vocos, [self.rows(o) for o in outputs], self.dtype)


def mel_sources(decoder: Decoder, dvae: DVAE, vocos: Vocos, precision: Precision) -> dict[str, MelSource]:
    """Both mel sources by name, their modules moved to the precision's device and cast once for its audio dtype
    (one Vocos copy shared)."""
    dtype = precision.audio
    vocos = cast_for_autocast(vocos.to(precision.device), dtype)
    return {"decoder": DecoderSource(cast_for_autocast(decoder.to(precision.device), dtype), vocos, precision),
            "dvae": DVAESource(cast_for_autocast(dvae.to(precision.device), dtype), vocos, precision)}
