"""The CPU's bf16 channels-last audio path (audio/cpu_decode.py): its C++ ops against torch, a row's bits alone and
among 2 or 15 rows of other lengths (bf16 and float32, hidden states and codes), its distance to float32 against
autocast's, and a bf16 stream against the whole clip."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from chattts_velocity.audio import (
    DVAE,
    Decoder,
    StreamDecoder,
    Vocos,
    cpu_decode,
    decode_codes_batch,
    decode_hidden_batch,
)
from chattts_velocity.model import kernels

pytestmark = pytest.mark.skipif(not cpu_decode.available(), reason="no oneDNN bf16 or C++ kernels on this CPU")


@pytest.fixture
def models(dvae_sd: dict, decoder_sd: dict, vocos_sd: dict) -> tuple[DVAE, Decoder, Vocos]:
    return DVAE.from_state_dict(dvae_sd), Decoder.from_state_dict(decoder_sd), Vocos.from_state_dict(vocos_sd)


def autocast_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make decode.py take autocast's module path for bf16, as before this path existed."""
    monkeypatch.setattr(cpu_decode, "available", lambda: False)


@pytest.mark.parametrize("channels,dilation", [(512, 2), (32, 1), (40, 3)])
def test_dwconv_norm_is_conv_then_layer_norm(channels: int, dilation: int) -> None:
    g = torch.Generator().manual_seed(channels)
    x, w = torch.randn(37, channels, generator=g), torch.randn(channels, 1, 7, generator=g)
    b, gamma, beta = (torch.randn(channels, generator=g) for _ in range(3))
    got = kernels.ops().dwconv_norm(x, w[:, 0].T.contiguous(), b, dilation, gamma, beta, 1e-6)
    conv = F.conv1d(x.T[None], w, b, padding=3 * dilation, dilation=dilation, groups=channels)[0].T
    ref = F.layer_norm(conv, (channels,), gamma, beta, 1e-6)
    assert got.dtype == torch.bfloat16 and got.shape == ref.shape
    ulp = 2.0 ** -7 * ref.abs().clamp(min=2.0 ** -6)  # one bf16 rounding of each value, plus float32 noise
    assert bool(((got.float() - ref).abs() <= ulp).all())


def test_scale_add_is_the_layer_scale_and_residual() -> None:
    g = torch.Generator().manual_seed(0)
    x, y, gamma = torch.randn(9, 48, generator=g), torch.randn(9, 48, generator=g).bfloat16(), torch.randn(48)
    expected = x + gamma * y.float()
    out = kernels.ops().scale_add_(x, y, gamma)
    assert out.data_ptr() == x.data_ptr()
    torch.testing.assert_close(x, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, None])
@pytest.mark.parametrize("use_decoder", [True, False])
def test_a_row_is_its_bits_alone_among_3_and_16(models: tuple[DVAE, Decoder, Vocos], dtype: torch.dtype | None,
                                                use_decoder: bool) -> None:
    dvae, decoder, vocos = models
    g = torch.Generator().manual_seed(5)

    def make(t: int) -> torch.Tensor:
        return torch.randn(t, 64, generator=g) if use_decoder else torch.randint(0, 625, (t, 4), generator=g)

    def decode(rows: list[torch.Tensor]) -> list[np.ndarray]:
        if use_decoder:
            return decode_hidden_batch(decoder, vocos, rows, dtype)
        return decode_codes_batch(dvae, vocos, rows, dtype)

    row, others = make(23), [make(3 + 5 * i) for i in range(15)]
    alone = decode([row])[0]
    assert np.abs(alone).max() > 1e-2
    for n in (2, 15):
        rows = others[: n // 2] + [row] + others[n // 2: n]
        np.testing.assert_array_equal(decode(rows)[n // 2], alone)


def test_bf16_is_as_close_to_float32_as_autocast(models: tuple[DVAE, Decoder, Vocos],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _, decoder, vocos = models
    g = torch.Generator().manual_seed(7)
    rows = [torch.randn(t, 64, generator=g) for t in (40, 9)]
    exact = decode_hidden_batch(decoder, vocos, rows)
    fast = decode_hidden_batch(decoder, vocos, rows, torch.bfloat16)
    autocast_only(monkeypatch)
    before = decode_hidden_batch(decoder, vocos, rows, torch.bfloat16)
    for e, f, b in zip(exact, fast, before, strict=True):
        assert not np.array_equal(f, b)  # the new path ran
        assert np.abs(f - e).max() <= 1.5 * np.abs(b - e).max()


def test_a_bf16_stream_is_the_whole_clip(models: tuple[DVAE, Decoder, Vocos]) -> None:
    """Windows decode alone in bf16: every frame's ops are the whole clip's (tolerance: oneDNN may sum otherwise
    at another number of frames)."""
    _, decoder, vocos = models
    x = torch.randn(90, 64, generator=torch.Generator().manual_seed(3))
    whole = decode_hidden_batch(decoder, vocos, [x], torch.bfloat16)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sd = StreamDecoder(decoder, vocos, chunk_steps=24)
        got = np.concatenate([sd.push(x[i: i + 7]) for i in range(0, 90, 7)] + [sd.flush()])
    assert got.shape == whole.shape
    np.testing.assert_allclose(got, whole, rtol=0, atol=1e-3 * np.abs(whole).max())
