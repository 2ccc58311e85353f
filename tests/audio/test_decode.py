"""Batch decode: per-row lengths (2*T_i - 1)*256; every row is the same bits as the row decoded alone, whatever rows
come with it (equal or other lengths, any count, float32 and bf16); empty inputs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from chattts_velocity.audio import DVAE, Decoder, Vocos, cast_for_autocast, decode_codes_batch, decode_hidden_batch


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
            np.testing.assert_array_equal(w, alone(decoder, vocos, h))
    assert not np.allclose(wavs[1], 0)


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_a_row_is_the_same_bits_alone_and_among_any_rows(models: tuple[DVAE, Decoder, Vocos],
                                                         dtype: torch.dtype | None) -> None:
    """A shared batch (the same row among 1, 7 or 31 others, equal or other lengths) would move its last bits."""
    _, decoder, vocos = models
    g = torch.Generator().manual_seed(1)
    row = torch.randn(9, 64, generator=g)
    others = [torch.randn(9 if i % 2 else 4 + i, 64, generator=g) for i in range(31)]
    alone_wav = decode_hidden_batch(decoder, vocos, [row], dtype)[0]
    for n in (1, 7, 31):
        rows = others[: n // 2] + [row] + others[n // 2: n]
        np.testing.assert_array_equal(decode_hidden_batch(decoder, vocos, rows, dtype)[n // 2], alone_wav)


def test_padding_does_not_reach_shorter_rows(models: tuple[DVAE, Decoder, Vocos]) -> None:
    """The one zero-padded batch of upstream changes a shorter row's last frames; decoding each row alone does not."""
    _, decoder, vocos = models
    short, long = torch.randn(6, 64), torch.randn(30, 64)
    padded = torch.zeros(2, 64, 30)
    padded[0, :, :6], padded[1] = short.T, long.T
    upstream = vocos.decode(decoder(padded))[0, : 11 * 256].numpy()
    own = alone(decoder, vocos, short)
    assert np.abs(upstream - own).max() > 1e-3
    np.testing.assert_allclose(decode_hidden_batch(decoder, vocos, [short, long])[0], own, rtol=0, atol=1e-5)


def test_codes_batch_lengths(models: tuple[DVAE, Decoder, Vocos]) -> None:
    dvae, _, vocos = models
    codes = [torch.randint(0, 625, (t, 4)) for t in (3, 7)]
    wavs = decode_codes_batch(dvae, vocos, codes)
    assert [len(w) for w in wavs] == [5 * 256, 13 * 256]
    for w, c in zip(wavs, codes, strict=True):  # each row decoded alone
        np.testing.assert_array_equal(w, decode_codes_batch(dvae, vocos, [c])[0])


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
    decoder16, dvae16, vocos16 = (cast_for_autocast(m, torch.bfloat16) for m in (decoder, dvae, vocos))
    assert decoder16.out_conv.weight.dtype == torch.bfloat16 and decoder.out_conv.weight.dtype == torch.float32
    assert decoder16.coef.dtype == torch.float32 and vocos16.backbone.norm.weight.dtype == torch.float32
    assert cast_for_autocast(decoder, None) is decoder and cast_for_autocast(vocos, torch.float32) is vocos
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
def test_full_size_rows_are_the_row_alone_bit_for_bit(full_assets) -> None:
    """Full size, float32 and bf16 (also with the weights cast once): each row of equal or mixed lengths gives the
    bits it gives decoded alone."""
    from chattts_velocity.assets import AssetPaths
    from chattts_velocity.audio import load_safetensors

    paths = AssetPaths.from_root(full_assets)
    decoder = Decoder.from_state_dict(load_safetensors(paths.decoder))
    vocos = Vocos.from_state_dict(load_safetensors(paths.vocos))
    g = torch.Generator().manual_seed(0)
    equal = [torch.randn(40, 768, generator=g) for _ in range(4)]
    mixed = [h[:n] for h, n in zip(equal, (40, 9, 33, 1), strict=True)]
    for dtype in (None, torch.bfloat16):
        decoder_cast, vocos_cast = cast_for_autocast(decoder, dtype), cast_for_autocast(vocos, dtype)
        for rows in (equal, mixed):
            alone_wavs = [decode_hidden_batch(decoder, vocos, [h], dtype)[0] for h in rows]
            for got in (decode_hidden_batch(decoder, vocos, rows, dtype),
                        decode_hidden_batch(decoder_cast, vocos_cast, rows, dtype)):
                for w, own in zip(got, alone_wavs, strict=True):
                    np.testing.assert_array_equal(w, own)
