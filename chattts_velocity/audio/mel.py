"""Audio stage: the log-mel front-end (wav [.., N] -> log mel [.., n_mels, N//hop + 1]).

Same buffers and numbers as torchaudio's MelSpectrogram (power 1, center reflect padding, htk mel
scale, norm None), without torchaudio: the window and filterbank come from the checkpoint.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from chattts_velocity.audio.loading import shape_of
from chattts_velocity.audio.wav import HOP_LENGTH, SAMPLE_RATE


def htk_mel_filterbank(n_freqs: int = 513, n_mels: int = 100, sample_rate: int = SAMPLE_RATE,
                       f_min: float = 0.0, f_max: float | None = None) -> torch.Tensor:
    """Triangular HTK-mel filterbank [n_freqs, n_mels] (torchaudio melscale_fbanks, norm None)."""
    f_max = float(sample_rate // 2) if f_max is None else f_max
    freqs = torch.linspace(0, sample_rate // 2, n_freqs)  # [n_freqs] float32
    mel_lo = 2595.0 * math.log10(1.0 + f_min / 700.0)
    mel_hi = 2595.0 * math.log10(1.0 + f_max / 700.0)
    mels = torch.linspace(mel_lo, mel_hi, n_mels + 2)
    edges = 700.0 * (10.0 ** (mels / 2595.0) - 1.0)  # [n_mels + 2] band edges in Hz
    widths = edges[1:] - edges[:-1]  # [n_mels + 1]
    dist = edges.unsqueeze(0) - freqs.unsqueeze(1)  # [n_freqs, n_mels + 2]
    rising = -dist[:, :-2] / widths[:-1]
    falling = dist[:, 2:] / widths[1:]
    return torch.clamp(torch.minimum(rising, falling), min=0.0)


class Spectrogram(nn.Module):
    """|STFT| with a periodic window buffer, center=True, reflect padding, onesided."""

    window: torch.Tensor  # [n_fft], a buffer

    def __init__(self, n_fft: int = 1024, hop_length: int = HOP_LENGTH) -> None:
        super().__init__()
        self.hop_length = hop_length
        self.register_buffer("window", torch.hann_window(n_fft))

    def forward(self, wav: torch.Tensor) -> torch.Tensor:  # [..., N] -> [..., n_fft//2+1, N//hop+1]
        n_fft = self.window.shape[0]
        if wav.shape[-1] <= n_fft // 2:
            raise ValueError(f"wav: need more than {n_fft // 2} samples for reflect padding, got {wav.shape[-1]}")
        flat = wav.reshape(-1, wav.shape[-1])
        spec = torch.stft(flat, n_fft, self.hop_length, n_fft, self.window, center=True,
                          pad_mode="reflect", normalized=False, onesided=True, return_complex=True)
        return spec.reshape(wav.shape[:-1] + spec.shape[-2:]).abs()


class MelScale(nn.Module):
    """Linear-frequency magnitudes -> mel bands through the filterbank buffer `fb` [n_freqs, n_mels]."""

    fb: torch.Tensor

    def __init__(self, n_freqs: int = 513, n_mels: int = 100, sample_rate: int = SAMPLE_RATE) -> None:
        super().__init__()
        self.register_buffer("fb", htk_mel_filterbank(n_freqs, n_mels, sample_rate))

    def forward(self, spec: torch.Tensor) -> torch.Tensor:  # [..., n_freqs, F] -> [..., n_mels, F]
        return torch.matmul(spec.transpose(-1, -2), self.fb).transpose(-1, -2)


class MelSpectrogram(nn.Module):
    """Magnitude mel spectrogram; buffers `spectrogram.window` and `mel_scale.fb`."""

    def __init__(self, n_fft: int = 1024, hop_length: int = HOP_LENGTH, n_mels: int = 100,
                 sample_rate: int = SAMPLE_RATE) -> None:
        super().__init__()
        self.spectrogram = Spectrogram(n_fft, hop_length)
        self.mel_scale = MelScale(n_fft // 2 + 1, n_mels, sample_rate)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:  # [..., N] -> [..., n_mels, N//hop+1]
        mel: torch.Tensor = self.mel_scale(self.spectrogram(wav))
        return mel


class MelSpectrogramFeatures(nn.Module):
    """log(clamp(mel, 1e-5)); the `preprocessor_mel` of the DVAE and `feature_extractor` of Vocos."""

    def __init__(self, n_fft: int = 1024, hop_length: int = HOP_LENGTH, n_mels: int = 100,
                 sample_rate: int = SAMPLE_RATE) -> None:
        super().__init__()
        self.mel_spec = MelSpectrogram(n_fft, hop_length, n_mels, sample_rate)

    @classmethod
    def sized_like(cls, sd: dict[str, torch.Tensor], prefix: str, what: str,
                   hop_length: int = HOP_LENGTH, sample_rate: int = SAMPLE_RATE) -> MelSpectrogramFeatures:
        n_fft = shape_of(sd, f"{prefix}mel_spec.spectrogram.window", what)[0]
        n_freqs, n_mels = shape_of(sd, f"{prefix}mel_spec.mel_scale.fb", what)
        if n_freqs != n_fft // 2 + 1:
            raise ValueError(f"{what}: mel filterbank has {n_freqs} rows, expected n_fft//2+1 = {n_fft // 2 + 1}")
        return cls(n_fft, hop_length, n_mels, sample_rate)

    @property
    def n_mels(self) -> int:
        return self.mel_spec.mel_scale.fb.shape[1]

    def forward(self, wav: torch.Tensor) -> torch.Tensor:  # [..., N] -> [..., n_mels, N//hop+1]
        return torch.log(torch.clamp(self.mel_spec(wav), min=1e-5))
