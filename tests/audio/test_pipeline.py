"""Batch decode: per-row lengths (2*T_i - 1)*256; equal rows are today's one plain batch bit for bit; rows of
other lengths decode as if alone (padding never reaches them); length groups; empty inputs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from chattts_velocity.audio import DVAE, Decoder, Vocos, cast_for_autocast, decode_codes_batch, decode_hidden_batch
from chattts_velocity.audio.pipeline import length_groups


@pytest.fixture
def models(dvae_sd: dict, decoder_sd: dict, vocos_sd: dict) -> tuple[DVAE, Decoder, Vocos]:
    return DVAE.from_state_dict(dvae_sd), Decoder.from_state_dict(decoder_sd), Vocos.from_state_dict(vocos_sd)


def alone(decoder: Decoder, vocos: Vocos, hidden: torch.Tensor) -> np.ndarray:  # [T, H] -> the row's own decode
    return vocos.decode(decoder(hidden.T[None]))[0].numpy()


def test_hidden_batch_lengths_and_content(models: tuple[DVAE, Decoder, Vocos]) -> None:
    _, decoder, vocos = models
    lengths = [5, 2, 9, 0, 8, 1]
    hiddens = [torch.randn(t, 64) for t in lengths]
    wavs = decode_hidden_batch(decoder, vocos, hiddens)
    assert [w.shape[0] for w in wavs] == [max(2 * t - 1, 0) * 256 for t in lengths]
    assert all(w.dtype == np.float32 for w in wavs)
    for w, h in zip(wavs, hiddens, strict=True):
        if len(h):
            np.testing.assert_allclose(w, alone(decoder, vocos, h), rtol=0, atol=1e-5)
    assert not np.allclose(wavs[1], 0)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_equal_rows_are_one_plain_batch(models: tuple[DVAE, Decoder, Vocos], dtype: torch.dtype | None) -> None:
    """Equal lengths (every forced-length benchmark): bit for bit the one padded batch decoded before."""
    _, decoder, vocos = models
    hiddens = [torch.randn(7, 64) for _ in range(3)]
    with torch.inference_mode(), torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        batch = vocos(decoder(torch.stack(hiddens).transpose(1, 2)).float()).float().numpy()
    for w, row in zip(decode_hidden_batch(decoder, vocos, hiddens, dtype), batch, strict=True):
        np.testing.assert_array_equal(w, row)


def test_padding_does_not_reach_shorter_rows(models: tuple[DVAE, Decoder, Vocos]) -> None:
    """The one zero-padded batch of upstream changes a shorter row's last frames; the masked groups do not."""
    _, decoder, vocos = models
    short, long = torch.randn(6, 64), torch.randn(30, 64)
    padded = torch.zeros(2, 64, 30)
    padded[0, :, :6], padded[1] = short.T, long.T
    upstream = vocos.decode(decoder(padded))[0, : 11 * 256].numpy()
    own = alone(decoder, vocos, short)
    assert np.abs(upstream - own).max() > 1e-3
    np.testing.assert_allclose(decode_hidden_batch(decoder, vocos, [short, long])[0], own, rtol=0, atol=1e-5)


def test_length_groups() -> None:
    assert length_groups([]) == []
    assert length_groups([0, 0]) == []
    assert length_groups([64] * 4) == [[0, 1, 2, 3]]
    assert length_groups([10, 40, 0, 31, 30, 9, 8]) == [[1, 3, 4], [0, 5, 6]]
    groups = length_groups(list(range(1, 200)))
    assert sorted(i for g in groups for i in g) == list(range(199))
    assert all(min(g) + 1 >= 0.75 * (max(g) + 1) for g in groups)  # lengths are index + 1


def test_codes_batch_lengths(models: tuple[DVAE, Decoder, Vocos]) -> None:
    dvae, _, vocos = models
    codes = [torch.randint(0, 625, (t, 4)) for t in (3, 7)]
    wavs = decode_codes_batch(dvae, vocos, codes)
    assert [len(w) for w in wavs] == [5 * 256, 13 * 256]
    for w, c in zip(wavs, codes, strict=True):  # each row as if decoded alone
        np.testing.assert_allclose(w, decode_codes_batch(dvae, vocos, [c])[0], rtol=0, atol=1e-5)


def test_empty_inputs(models: tuple[DVAE, Decoder, Vocos]) -> None:
    dvae, decoder, vocos = models
    assert decode_hidden_batch(decoder, vocos, []) == []
    assert decode_codes_batch(dvae, vocos, []) == []
    out = decode_codes_batch(dvae, vocos, [torch.zeros(0, 4, dtype=torch.long)] * 2)
    assert [(w.shape, w.dtype) for w in out] == [((0,), np.float32)] * 2


def test_bad_rows_raise(models: tuple[DVAE, Decoder, Vocos]) -> None:
    dvae, decoder, vocos = models
    with pytest.raises(ValueError, match=r"\[T, 4\]"):
        decode_codes_batch(dvae, vocos, [torch.zeros(3, 5, dtype=torch.long)])
    with pytest.raises(ValueError, match="channel count"):
        decode_hidden_batch(decoder, vocos, [torch.randn(3, 64), torch.randn(3, 32)])


@pytest.mark.parametrize("use_decoder", [True, False])
def test_weights_cast_once_give_autocasts_numbers(models: tuple[DVAE, Decoder, Vocos], use_decoder: bool) -> None:
    dvae, decoder, vocos = models
    decoder16, dvae16, vocos16 = cast_for_autocast((decoder, dvae, vocos), torch.bfloat16)
    assert decoder16.out_conv.weight.dtype == torch.bfloat16 and decoder.out_conv.weight.dtype == torch.float32
    assert decoder16.coef.dtype == torch.float32 and vocos16.backbone.norm.weight.dtype == torch.float32
    assert cast_for_autocast((decoder, vocos), None) == (decoder, vocos)
    if use_decoder:
        rows = [torch.randn(t, 64) for t in (9, 9, 4)]
        got, expected = (decode_hidden_batch(d, v, rows, torch.bfloat16) for d, v in ((decoder16, vocos16),
                                                                                       (decoder, vocos)))
    else:
        rows = [torch.randint(0, 625, (t, 4)) for t in (9, 9, 4)]
        got, expected = (decode_codes_batch(d, v, rows, torch.bfloat16) for d, v in ((dvae16, vocos16),
                                                                                      (dvae, vocos)))
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_full_size_rows_match_the_plain_batch_and_the_row_alone(full_assets) -> None:
    """Full size: equal rows give the plain batch's bits in both precisions (also with the weights cast once);
    rows of mixed lengths give each row alone within 1e-4 (fp32; bf16 moves with the row count, see the docs)."""
    from chattts_velocity.assets import AssetPaths
    from chattts_velocity.audio import load_safetensors

    paths = AssetPaths.from_root(full_assets)
    decoder = Decoder.from_state_dict(load_safetensors(paths.decoder))
    vocos = Vocos.from_state_dict(load_safetensors(paths.vocos))
    g = torch.Generator().manual_seed(0)
    equal = [torch.randn(40, 768, generator=g) for _ in range(4)]
    for dtype in (None, torch.bfloat16):
        with torch.inference_mode(), torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            plain = vocos(decoder(torch.stack(equal).transpose(1, 2)).float()).float().numpy()
        decoder_cast, vocos_cast = cast_for_autocast((decoder, vocos), dtype)
        for got in (decode_hidden_batch(decoder, vocos, equal, dtype),
                    decode_hidden_batch(decoder_cast, vocos_cast, equal, dtype)):
            for w, row in zip(got, plain, strict=True):
                np.testing.assert_array_equal(w, row)
    mixed = [h[:n] for h, n in zip(equal, (40, 9, 33, 1), strict=True)]
    for w, h in zip(decode_hidden_batch(decoder, vocos, mixed), mixed, strict=True):
        np.testing.assert_allclose(w, decode_hidden_batch(decoder, vocos, [h])[0], rtol=0, atol=1e-4)
