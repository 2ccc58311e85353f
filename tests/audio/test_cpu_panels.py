"""The audio stage on 16-bit weights in fp32 arithmetic (audio/cpu_panels.py, the bf16 decode where the CPU has no
bf16 arithmetic): its C++ ops against torch in float32, a row's bits alone and among others (ops, hidden states,
codes), the waveform's SNR against float32, and a stream against the whole clip. Each test runs on the kernels'
ISA of this host with the decode forced onto this path, and (slow suite, where the CPU can) on the AVX2 kernels,
where the path is the default."""
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
    cpu_panels,
    decode_codes_batch,
    decode_hidden_batch,
)
from chattts_velocity.model import kernels

BF16 = torch.bfloat16


@pytest.fixture(params=[pytest.param(i, marks=() if i == kernels.isa() else pytest.mark.slow)
                        for i in dict.fromkeys([kernels.isa() or "none", "avx2"])])
def panels_isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The kernels of one ISA in use, bf16 decodes on the panels path."""
    monkeypatch.setenv(kernels.ENV_SWITCH, request.param)
    if request.param == "none" or kernels.unsupported() is not None or not kernels.load():
        pytest.skip(f"the {request.param} kernels cannot run here: {kernels.unsupported()}")
    if cpu_decode.path() != "panels":
        monkeypatch.setattr(cpu_decode, "path", lambda: "panels")
    return request.param


@pytest.fixture
def models(dvae_sd: dict, decoder_sd: dict, vocos_sd: dict) -> tuple[DVAE, Decoder, Vocos]:
    return DVAE.from_state_dict(dvae_sd), Decoder.from_state_dict(decoder_sd), Vocos.from_state_dict(vocos_sd)


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    return float(10 * np.log10((reference.astype(np.float64) ** 2).sum() / ((reference - other) ** 2).sum()))


@pytest.mark.parametrize("n,k,gelu", [(40, 24, False), (40, 24, True), (16, 7, True), (1026, 32, False)])
def test_audio_linear_is_float32_on_bf16_weights(panels_isa: str, n: int, k: int, gelu: bool) -> None:
    g = torch.Generator().manual_seed(n + k)
    x, w, b = torch.randn(13, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    got = cpu_panels.PanelLinear.of(w, b)(x, gelu)
    ref = F.linear(x.double(), w.to(BF16).double(), b.double())  # the weights' one rounding, exact sums
    ref = F.gelu(ref) if gelu else ref
    assert got.dtype == torch.float32 and got.shape == (13, n)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5 * k ** 0.5)


def test_audio_linear_add_is_the_layer_scale_and_residual(panels_isa: str) -> None:
    g = torch.Generator().manual_seed(1)
    x, w, b, gamma = torch.randn(9, 32, generator=g), torch.randn(20, 32, generator=g), torch.randn(20), torch.rand(20)
    residual = torch.randn(9, 20, generator=g)
    linear = cpu_panels.PanelLinear.of(w, b)
    expected = residual + gamma * linear(x)
    padded_gamma = F.pad(gamma, (0, -20 % cpu_panels.PANEL))  # zero-padded to the panels, as the bias
    out = kernels.ops().audio_linear_add_(residual, x, linear.panels, linear.bias, padded_gamma)
    assert out.data_ptr() == residual.data_ptr()
    torch.testing.assert_close(residual, expected, rtol=1e-6, atol=1e-6)


def test_a_rows_outputs_are_its_bits_alone_at_any_batch(panels_isa: str) -> None:
    """audio_linear's rows (any place in a group of rows, any M) and dwconv_norm_rows' rows (their own ends)."""
    g = torch.Generator().manual_seed(2)
    linear = cpu_panels.PanelLinear.of(torch.randn(72, 48, generator=g), torch.randn(72, generator=g))
    x = torch.randn(101, 48, generator=g)
    whole = linear(x, gelu=True)
    for a, b in ((0, 1), (5, 6), (7, 19), (40, 101)):
        assert torch.equal(linear(x[a:b].contiguous(), gelu=True), whole[a:b])
    c = 40
    w, bias, gamma, beta = torch.randn(7, c, generator=g), *(torch.randn(c, generator=g) for _ in range(3))
    offsets = [0, 11, 12, 40, 101]
    rows = kernels.ops().dwconv_norm_rows(x[:, :c].contiguous(), torch.tensor(offsets), w, bias, 2, gamma, beta, 1e-6)
    for a, b in zip(offsets, offsets[1:], strict=False):
        alone = kernels.ops().dwconv_norm_rows(x[a:b, :c].contiguous(), torch.tensor([0, b - a]), w, bias, 2, gamma,
                                               beta, 1e-6)
        assert torch.equal(alone, rows[a:b])
        conv = F.conv1d(x[a:b, :c].T[None], w.T[:, None], bias, padding=6, dilation=2, groups=c)[0].T
        torch.testing.assert_close(alone, F.layer_norm(conv, (c,), gamma, beta, 1e-6), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use_decoder", [True, False])
def test_a_row_is_its_bits_alone_among_3_and_16(models: tuple[DVAE, Decoder, Vocos], panels_isa: str,
                                                use_decoder: bool) -> None:
    dvae, decoder, vocos = models
    g = torch.Generator().manual_seed(5)

    def make(t: int) -> torch.Tensor:
        return torch.randn(t, 64, generator=g) if use_decoder else torch.randint(0, 625, (t, 4), generator=g)

    def decode(rows: list[torch.Tensor]) -> list[np.ndarray]:
        if use_decoder:
            return decode_hidden_batch(decoder, vocos, rows, BF16)
        return decode_codes_batch(dvae, vocos, rows, BF16)

    row, others = make(23), [make(1 + 5 * i) for i in range(15)]
    alone = decode([row])[0]
    assert np.abs(alone).max() > 1e-2
    for n in (2, 15):
        rows = others[: n // 2] + [row] + others[n // 2: n]
        got = decode(rows)
        np.testing.assert_array_equal(got[n // 2], alone)
        assert [w.shape[0] for w in got] == [(2 * r.shape[0] - 1) * 256 for r in rows]  # no padded frames


def test_the_waveform_is_within_30_db_of_float32(models: tuple[DVAE, Decoder, Vocos], panels_isa: str) -> None:
    _, decoder, vocos = models
    rows = [torch.randn(t, 64, generator=torch.Generator().manual_seed(t)) for t in (40, 9)]
    exact = decode_hidden_batch(decoder, vocos, rows)
    fast = decode_hidden_batch(decoder, vocos, rows, BF16)
    for e, f in zip(exact, fast, strict=True):
        assert not np.array_equal(e, f)  # the bf16 weights ran
        assert snr_db(e, f) >= 30.0


def test_a_stream_is_the_whole_clip(models: tuple[DVAE, Decoder, Vocos], panels_isa: str) -> None:
    """Windows batched with one another: every frame's ops are the whole clip's (fp32 sums in one fixed order)."""
    _, decoder, vocos = models
    x = torch.randn(90, 64, generator=torch.Generator().manual_seed(3))
    whole = decode_hidden_batch(decoder, vocos, [x], BF16)[0]
    with torch.autocast("cpu", dtype=BF16):
        sd = StreamDecoder(decoder, vocos, chunk_steps=24)
        got = np.concatenate([sd.push(x[i: i + 7]) for i in range(0, 90, 7)] + [sd.flush()])
    assert got.shape == whole.shape
    np.testing.assert_allclose(got, whole, rtol=0, atol=1e-4 * np.abs(whole).max())
