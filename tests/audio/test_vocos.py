"""Vocos: output length, equality with an independent F.* + torch.istft re-implementation, ISTFT overlap-add."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from chattts_velocity.audio.vocos import ISTFT, Vocos


def reference_vocos(mel: torch.Tensor, sd: dict[str, torch.Tensor]) -> torch.Tensor:
    """vocos 0.1.0 decode written out with functional ops."""
    dim = sd["backbone.embed.bias"].shape[0]
    x = F.conv1d(mel, sd["backbone.embed.weight"], sd["backbone.embed.bias"], padding=3)
    x = F.layer_norm(x.transpose(1, 2), (dim,), sd["backbone.norm.weight"], sd["backbone.norm.bias"], 1e-6)
    x = x.transpose(1, 2)
    k = 0
    while f"backbone.convnext.{k}.gamma" in sd:
        p = f"backbone.convnext.{k}."
        y = F.conv1d(x, sd[p + "dwconv.weight"], sd[p + "dwconv.bias"], padding=3, groups=dim)
        y = F.layer_norm(y.transpose(1, 2), (dim,), sd[p + "norm.weight"], sd[p + "norm.bias"], 1e-6)
        y = F.linear(F.gelu(F.linear(y, sd[p + "pwconv1.weight"], sd[p + "pwconv1.bias"])),
                     sd[p + "pwconv2.weight"], sd[p + "pwconv2.bias"])
        x = x + (sd[p + "gamma"] * y).transpose(1, 2)
        k += 1
    x = F.layer_norm(x.transpose(1, 2), (dim,), sd["backbone.final_layer_norm.weight"],
                     sd["backbone.final_layer_norm.bias"], 1e-6)
    h = F.linear(x, sd["head.out.weight"], sd["head.out.bias"]).transpose(1, 2)  # [B, 1026, T]
    n_bins = h.shape[1] // 2
    spec = torch.polar(torch.exp(h[:, :n_bins]).clamp(max=100.0), h[:, n_bins:])
    window = sd["head.istft.window"]
    return torch.istft(spec, window.shape[0], 256, window.shape[0], window, center=True)


@pytest.mark.parametrize("frames", [2, 9, 40])
def test_output_length_and_reference_equality(vocos_sd: dict[str, torch.Tensor], frames: int) -> None:
    vocos = Vocos.from_state_dict(vocos_sd)
    mel = torch.randn(3, 100, frames, generator=torch.Generator().manual_seed(frames))
    wav = vocos.decode(mel)
    assert wav.shape == (3, (frames - 1) * 256) and wav.dtype == torch.float32
    torch.testing.assert_close(wav, reference_vocos(mel, vocos_sd), atol=1e-5, rtol=1e-4)


def test_magnitude_is_clipped_at_100(vocos_sd: dict[str, torch.Tensor]) -> None:
    vocos_sd["head.out.bias"][:513] = 50.0  # exp(50) would overflow the ISTFT without the clip
    mel = torch.randn(1, 100, 6)
    wav = Vocos.from_state_dict(vocos_sd).decode(mel)
    assert torch.isfinite(wav).all()
    torch.testing.assert_close(wav, reference_vocos(mel, vocos_sd), atol=1e-4, rtol=1e-4)


def test_istft_equals_manual_overlap_add() -> None:
    istft = ISTFT(64, 16)
    g = torch.Generator().manual_seed(0)
    frames = torch.randn(1, 10, 64, generator=g)  # time-domain frames with a consistent spectrum
    spec = torch.fft.rfft(frames, dim=-1).transpose(1, 2)  # [1, 33, 10]
    out = istft(spec)
    win = istft.window.double()
    total = 64 + 16 * 9
    acc, norm = torch.zeros(total, dtype=torch.float64), torch.zeros(total, dtype=torch.float64)
    for t in range(10):
        acc[16 * t:16 * t + 64] += torch.fft.irfft(spec[0, :, t].cdouble(), n=64) * win
        norm[16 * t:16 * t + 64] += win**2
    expected = (acc[32:total - 32] / norm[32:total - 32]).float()
    assert out.shape == (1, 16 * 9)
    torch.testing.assert_close(out[0], expected, atol=1e-5, rtol=1e-5)


def test_bad_mel_is_a_value_error(vocos_sd: dict[str, torch.Tensor]) -> None:
    vocos = Vocos.from_state_dict(vocos_sd)
    with pytest.raises(ValueError, match="mel"):
        vocos.decode(torch.randn(1, 80, 10))
    with pytest.raises(ValueError, match="T >= 2"):
        vocos.decode(torch.randn(1, 100, 1))


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_spectrum_is_the_complex_product_bit_for_bit(vocos_sd: dict[str, torch.Tensor], dtype) -> None:
    """The head builds mag * (cos + 1j sin) without complex temporaries; the numbers are the same."""
    head = Vocos.from_state_dict(vocos_sd).head
    x = torch.randn(2, 9, head.out.in_features)
    with torch.inference_mode(), torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        mag, phase = head.out(x).transpose(1, 2).chunk(2, dim=1)
        mag = torch.clip(torch.exp(mag), max=1e2)
        expected = mag * (torch.cos(phase) + 1j * torch.sin(phase))
        got = head.spectrum(x)
    assert got.dtype == expected.dtype == torch.complex64
    assert torch.equal(torch.view_as_real(got), torch.view_as_real(expected))
