"""Mel front-end against a hand-framed rfft + filterbank; the HTK filterbank against numpy."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from audio_state_dicts import numpy_htk_filterbank

from chattts_velocity.audio.mel import MelSpectrogramFeatures, htk_mel_filterbank


@pytest.mark.parametrize(("n_freqs", "n_mels", "rate", "f_min", "f_max"),
                         [(513, 100, 24000, 0.0, None), (257, 40, 16000, 50.0, 7000.0)])
def test_filterbank_matches_numpy_htk(n_freqs: int, n_mels: int, rate: int, f_min: float,
                                      f_max: float | None) -> None:
    fb = htk_mel_filterbank(n_freqs, n_mels, rate, f_min, f_max)
    assert fb.shape == (n_freqs, n_mels) and fb.dtype == torch.float32
    np.testing.assert_allclose(fb.numpy(), numpy_htk_filterbank(n_freqs, n_mels, rate, f_min, f_max), atol=2e-5)


def framed_magnitude(wav: torch.Tensor, window: torch.Tensor, hop: int) -> torch.Tensor:
    """|rfft| of reflect-padded, windowed frames: [N] -> [n_fft//2+1, N//hop+1]."""
    n_fft = window.shape[0]
    padded = F.pad(wav[None, None], (n_fft // 2, n_fft // 2), mode="reflect")[0, 0].double()
    frames = padded.unfold(0, n_fft, hop) * window.double()  # [F, n_fft]
    return torch.fft.rfft(frames, dim=-1).abs().T


def test_log_mel_matches_independent_computation() -> None:
    feats = MelSpectrogramFeatures()
    g = torch.Generator().manual_seed(0)
    wav = torch.sin(torch.arange(6000) * 2 * math.pi * 440 / 24000) * 0.5 + 0.01 * torch.randn(6000, generator=g)
    wav[1500:4500] = 0.0  # a silent stretch exercises the 1e-5 clamp
    out = feats(wav)
    assert out.shape == (100, 6000 // 256 + 1)
    fb = torch.from_numpy(numpy_htk_filterbank(513, 100, 24000))
    mel = fb.T @ framed_magnitude(wav, torch.hann_window(1024, dtype=torch.float64), 256)
    expected = torch.log(torch.clamp(mel, min=1e-5)).float()
    torch.testing.assert_close(out, expected, atol=1e-3, rtol=1e-4)
    assert torch.isclose(out.min(), torch.tensor(math.log(1e-5)))


def test_front_end_uses_checkpoint_buffers_and_batches() -> None:
    feats = MelSpectrogramFeatures()
    keys = set(feats.state_dict())
    assert keys == {"mel_spec.spectrogram.window", "mel_spec.mel_scale.fb"}
    with torch.no_grad():
        feats.mel_spec.mel_scale.fb.mul_(2.0)
    wav = torch.randn(2, 3000)
    plain = MelSpectrogramFeatures()(wav)
    torch.testing.assert_close(feats(wav), torch.log(torch.clamp(2 * torch.exp(plain), min=1e-5)))
    torch.testing.assert_close(feats(wav)[1], feats(wav[1]))


def test_too_short_clip_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="samples"):
        MelSpectrogramFeatures()(torch.zeros(100))
