"""Audio stage: GPT hidden states or codes -> mel (Decoder, DVAE), and wav -> codes (DVAE.encode).

Decoder: hidden [B, H, T] -> mel [B, 100, 2T]. DVAE: codes [B, 4, T] -> mel [B, 100, 2T] and
24 kHz wav [N] -> codes [4, (N//256 + 1)//2]. Sizes come from the state dict; keys equal the official files.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from chattts_velocity.audio.convnext import ConvNeXtStack, masked
from chattts_velocity.audio.gfsq import GFSQ, FSQVariant
from chattts_velocity.audio.loading import load_strict, shape_of
from chattts_velocity.audio.mel import MelSpectrogramFeatures


def interleave(x: torch.Tensor) -> torch.Tensor:  # [B, 2C, T] -> [B, C, 2T]
    """Step t's first channel half becomes frame 2t, its second half frame 2t+1."""
    b, c2, t = x.shape
    return x.reshape(b, 2, c2 // 2, t).permute(0, 2, 3, 1).flatten(2)


def _mel_head(n_in: int, n_mels: int) -> tuple[nn.Conv1d, torch.Tensor]:
    """out_conv (k3, no bias) and the per-mel-channel coef buffer [1, n_mels, 1]."""
    return nn.Conv1d(n_in, n_mels, 3, 1, 1, bias=False), torch.ones(1, n_mels, 1)


class Decoder(nn.Module):
    """Decoder.safetensors: interleave -> conv stack -> out_conv -> * coef."""

    coef: torch.Tensor  # [1, n_mels, 1], a buffer

    def __init__(self, decoder: ConvNeXtStack, n_mels: int = 100) -> None:
        super().__init__()
        self.decoder = decoder
        self.out_conv, coef = _mel_head(decoder.odim, n_mels)
        self.register_buffer("coef", coef)

    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor]) -> Decoder:
        return load_strict(cls.sized_like(sd), sd, "Decoder").eval()

    @classmethod
    def sized_like(cls, sd: dict[str, torch.Tensor]) -> Decoder:
        """An unloaded Decoder with the sizes of sd (use from_state_dict to also load it)."""
        n_mels = shape_of(sd, "out_conv.weight", "Decoder")[0]
        return cls(ConvNeXtStack.sized_like(sd, "decoder.", "Decoder"), n_mels)

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, H, T] -> [B, n_mels, 2T]; mask [B, 1, 2T] decodes right-padded rows as if each were alone."""
        expected = 2 * self.decoder.idim
        if hidden.dim() != 3 or hidden.shape[1] != expected:
            raise ValueError(f"hidden: expected [B, {expected}, T] (channels first), got {tuple(hidden.shape)}")
        mel: torch.Tensor = self.out_conv(masked(self.decoder(interleave(hidden), mask), mask))
        return mel * self.coef

    @torch.inference_mode()
    def decode(self, hidden: torch.Tensor) -> torch.Tensor:  # [B, H, T] -> [B, n_mels, 2T]
        mel: torch.Tensor = self(hidden)
        return mel


class DVAE(nn.Module):
    """DVAE.safetensors: GFSQ codes <-> features, conv-stack decoder, mel encoder front-end."""

    coef: torch.Tensor  # [1, n_mels, 1], a buffer

    def __init__(self, encoder: ConvNeXtStack, decoder: ConvNeXtStack, vq_layer: GFSQ,
                 preprocessor_mel: MelSpectrogramFeatures) -> None:
        super().__init__()
        n_mels, dim = preprocessor_mel.n_mels, encoder.idim
        self.downsample_conv = nn.Sequential(
            nn.Conv1d(n_mels, dim, 3, 1, 1), nn.GELU(), nn.Conv1d(dim, dim, 4, 2, 1), nn.GELU()
        )
        self.preprocessor_mel = preprocessor_mel
        self.encoder = encoder
        self.decoder = decoder
        self.out_conv, coef = _mel_head(decoder.odim, n_mels)
        self.register_buffer("coef", coef)
        self.vq_layer = vq_layer

    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor],
                        variant: FSQVariant = FSQVariant.VQP_1_18_5) -> DVAE:
        return load_strict(cls.sized_like(sd, variant), sd, "DVAE").eval()

    @classmethod
    def sized_like(cls, sd: dict[str, torch.Tensor],
                   variant: FSQVariant = FSQVariant.VQP_1_18_5) -> DVAE:
        """An unloaded DVAE with the sizes of sd (use from_state_dict to also load it)."""
        return cls(
            ConvNeXtStack.sized_like(sd, "encoder.", "DVAE"),
            ConvNeXtStack.sized_like(sd, "decoder.", "DVAE"),
            GFSQ.sized_like(sd, "vq_layer.", "DVAE", variant=variant),
            MelSpectrogramFeatures.sized_like(sd, "preprocessor_mel.", "DVAE"),
        )

    def forward(self, codes: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, 4, T] int -> [B, n_mels, 2T]; mask [B, 1, 2T] as in Decoder.forward."""
        feats = self.vq_layer.decode(codes)  # [B, dim, T]
        mel: torch.Tensor = self.out_conv(masked(self.decoder(interleave(feats), mask), mask))
        return mel * self.coef

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:  # [B, 4, T] int -> [B, n_mels, 2T]
        mel: torch.Tensor = self(codes)
        return mel

    @torch.inference_mode()
    def encode(self, wav: torch.Tensor | np.ndarray) -> torch.Tensor:  # [N] float 24 kHz -> [4, T] int32
        """Reference-voice codes of a mono 24 kHz clip; T = (N//256 + 1)//2."""
        wav = torch.as_tensor(wav)
        if wav.dim() != 1 or not wav.is_floating_point():
            raise ValueError(
                f"wav: expected a 1-D float mono waveform at 24 kHz, got {tuple(wav.shape)} {wav.dtype}; "
                "mix down to mono and resample first"
            )
        wav = wav.to(device=self.coef.device, dtype=torch.float32)
        mel = self.preprocessor_mel(wav) / self.coef[0]  # [n_mels, F]
        x = self.downsample_conv(mel.unsqueeze(0))  # [1, dim, F//2]
        return self.vq_layer.encode(self.encoder(x))[0]  # [4, T]
