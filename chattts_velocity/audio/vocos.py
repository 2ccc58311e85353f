"""Audio stage: inference-only Vocos vocoder (mel [B, 100, T] -> 24 kHz wav [B, (T-1)*hop]).

Same state-dict keys as vocos 0.1.0 (feature_extractor / backbone / head); no torchaudio needed.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from chattts_velocity.audio.convnext import ConvNeXtBlock, masked
from chattts_velocity.audio.loading import count_indexed, load_strict, shape_of
from chattts_velocity.audio.mel import MelSpectrogramFeatures
from chattts_velocity.audio.wav import HOP_LENGTH


class VocosBackbone(nn.Module):
    """Conv1d embed (k7) -> LN -> ConvNeXt blocks (dilation 1, `gamma`) -> final LN."""

    def __init__(self, input_channels: int, dim: int, intermediate_dim: int, num_layers: int,
                 kernel: int = 7) -> None:
        super().__init__()
        self.embed = nn.Conv1d(input_channels, dim, kernel, padding=kernel // 2)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.convnext = nn.ModuleList(
            ConvNeXtBlock(dim, intermediate_dim, kernel, 1, "gamma") for _ in range(num_layers)
        )
        self.final_layer_norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, mel: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, n_mels, T] -> [B, T, dim]; mask [B, 1, T] (1 inside a row) makes each row's frames what they are
        decoded alone."""
        x = self.norm(self.embed(masked(mel, mask)).transpose(1, 2)).transpose(1, 2)  # [B, dim, T]
        for block in self.convnext:
            x = block(masked(x, mask))
        out: torch.Tensor = self.final_layer_norm(x.transpose(1, 2))
        return out


class ISTFT(nn.Module):
    """torch.istft with center=True and the checkpoint's window buffer.

    On CUDA the same inverse runs as irfft + overlap-add (F.fold) divided by the window envelope: torch.istft checks
    the envelope on every call (NOLA), which reads a value back and makes the host wait; here it is checked once,
    when the checkpoint loads (check_window). Equal to torch.istft to float rounding (tests/audio/test_vocos.py).
    """

    window: torch.Tensor  # [n_fft], a buffer

    def __init__(self, n_fft: int = 1024, hop_length: int = HOP_LENGTH) -> None:
        super().__init__()
        self.hop_length = hop_length
        self.register_buffer("window", torch.hann_window(n_fft))

    def forward(self, spec: torch.Tensor) -> torch.Tensor:  # [B, n_fft//2+1, T] complex -> [B, (T-1)*hop]
        n_fft = self.window.shape[0]
        if not spec.is_cuda:
            return torch.istft(spec, n_fft, self.hop_length, n_fft, self.window, center=True)
        return self.overlap_add(spec)

    def overlap_add(self, spec: torch.Tensor) -> torch.Tensor:  # [B, n_fft//2+1, T] complex -> [B, (T-1)*hop]
        n_fft, hop, frames = self.window.shape[0], self.hop_length, spec.shape[-1]
        window = self.window.to(torch.float32)
        length = n_fft + hop * (frames - 1)

        def fold(x: torch.Tensor) -> torch.Tensor:  # [B, n_fft, frames] overlap-added -> [B, length]
            return F.fold(x, output_size=(1, length), kernel_size=(1, n_fft), stride=(1, hop))[:, 0, 0]

        signal = fold(torch.fft.irfft(spec, n=n_fft, dim=1) * window[None, :, None])  # [B, length]
        envelope = fold((window**2)[None, :, None].expand(1, n_fft, frames))  # [1, length]
        return (signal / envelope)[:, n_fft // 2: length - n_fft // 2]

    def check_window(self) -> None:
        """The NOLA condition torch.istft checks per call, once: every output sample has window weight."""
        n_fft, hop = self.window.shape[0], self.hop_length
        frames = 2 * (n_fft // hop) + 1
        envelope = F.fold((self.window.float() ** 2)[None, :, None].expand(1, n_fft, frames).cpu(),
                          output_size=(1, n_fft + hop * (frames - 1)), kernel_size=(1, n_fft), stride=(1, hop))
        interior = envelope[0, 0, 0, n_fft // 2: -(n_fft // 2)]
        if float(interior.abs().min()) < 1e-11:
            raise ValueError(f"head.istft.window: violates the NOLA condition at hop {hop} (an iSTFT cannot invert it)")


class ISTFTHead(nn.Module):
    """Linear(dim -> n_fft+2) -> log-magnitude (exp, clip 100) and phase -> ISTFT."""

    def __init__(self, dim: int, n_fft: int = 1024, hop_length: int = HOP_LENGTH) -> None:
        super().__init__()
        self.out = nn.Linear(dim, n_fft + 2)
        self.istft = ISTFT(n_fft, hop_length)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, dim] -> [B, (T-1)*hop]
        wav: torch.Tensor = self.istft(self.spectrum(x))
        return wav

    def spectrum(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, dim] -> [B, n_fft//2+1, T] complex
        return self.polar(self.out(x).transpose(1, 2))

    @staticmethod
    def polar(out: torch.Tensor) -> torch.Tensor:  # [B, n_fft+2, T] -> [B, n_fft//2+1, T] complex
        """The head's output as log-magnitudes (clipped at exp = 100) and phases."""
        mag, phase = out.chunk(2, dim=1)  # 2 x [B, n_fft//2+1, T]
        mag = torch.clip(torch.exp(mag), max=1e2).float()
        # = mag * (cos + 1j * sin) bit for bit (the imaginary zero adds exact zeros), without complex temporaries
        return torch.complex(mag * torch.cos(phase).float(), mag * torch.sin(phase).float())


class Vocos(nn.Module):
    """Vocos.safetensors. The feature extractor's buffers load but decode() does not use them."""

    def __init__(self, feature_extractor: MelSpectrogramFeatures, backbone: VocosBackbone,
                 head: ISTFTHead) -> None:
        super().__init__()
        self.feature_extractor = feature_extractor
        self.backbone = backbone
        self.head = head

    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor], hop_length: int = HOP_LENGTH) -> Vocos:
        vocos = load_strict(cls.sized_like(sd, hop_length), sd, "Vocos").eval()
        vocos.head.istft.check_window()
        return vocos

    @classmethod
    def sized_like(cls, sd: dict[str, torch.Tensor], hop_length: int = HOP_LENGTH) -> Vocos:
        """An unloaded Vocos with the sizes of sd (use from_state_dict to also load it)."""
        dim, n_mels, kernel = shape_of(sd, "backbone.embed.weight", "Vocos")
        inter = shape_of(sd, "backbone.convnext.0.pwconv1.weight", "Vocos")[0]
        layers = count_indexed(sd, "backbone.convnext.", "Vocos")
        n_fft = shape_of(sd, "head.istft.window", "Vocos")[0]
        n_out = shape_of(sd, "head.out.weight", "Vocos")[0]
        if n_out != n_fft + 2:
            raise ValueError(f"Vocos: head.out has {n_out} rows, expected n_fft + 2 = {n_fft + 2}")
        return cls(
            MelSpectrogramFeatures.sized_like(sd, "feature_extractor.", "Vocos", hop_length),
            VocosBackbone(n_mels, dim, inter, layers, kernel),
            ISTFTHead(dim, n_fft, hop_length),
        )

    def forward(self, mel: torch.Tensor) -> torch.Tensor:  # [B, n_mels, T] -> [B, (T-1)*hop]
        n_mels = self.backbone.embed.in_channels
        if mel.dim() != 3 or mel.shape[1] != n_mels or mel.shape[2] < 2:
            raise ValueError(f"mel: expected [B, {n_mels}, T] with T >= 2, got {tuple(mel.shape)}")
        wav: torch.Tensor = self.head(self.backbone(mel))
        return wav

    @torch.inference_mode()
    def decode(self, mel: torch.Tensor) -> torch.Tensor:  # [B, n_mels, T] -> [B, (T-1)*hop]
        wav: torch.Tensor = self(mel)
        return wav
