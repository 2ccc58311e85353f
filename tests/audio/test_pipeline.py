"""Batch decode: per-row lengths (2*T_i - 1)*256, rows cut (never padded tails), empty inputs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from chattts_velocity.audio import DVAE, Decoder, Vocos, decode_codes_batch, decode_hidden_batch


@pytest.fixture
def models(dvae_sd: dict, decoder_sd: dict, vocos_sd: dict) -> tuple[DVAE, Decoder, Vocos]:
    return DVAE.from_state_dict(dvae_sd), Decoder.from_state_dict(decoder_sd), Vocos.from_state_dict(vocos_sd)


def test_hidden_batch_lengths_and_content(models: tuple[DVAE, Decoder, Vocos]) -> None:
    _, decoder, vocos = models
    lengths = [5, 2, 9, 0]
    hiddens = [torch.randn(t, 64) for t in lengths]
    wavs = decode_hidden_batch(decoder, vocos, hiddens)
    assert [w.shape[0] for w in wavs] == [max(2 * t - 1, 0) * 256 for t in lengths]
    assert all(w.dtype == np.float32 for w in wavs)
    padded = torch.zeros(4, 64, 9)  # the batch upstream decodes: zero-padded, channels first
    for i, h in enumerate(hiddens):
        padded[i, :, : h.shape[0]] = h.T
    full = vocos.decode(decoder(padded)).numpy()  # [4, 17*256]
    for w, t, row in zip(wavs, lengths, full):
        np.testing.assert_array_equal(w, row[: len(w)])
        assert len(w) < full.shape[1] or t == 9  # shorter rows carry no padded tail
    assert not np.allclose(wavs[1], 0)


def test_codes_batch_lengths(models: tuple[DVAE, Decoder, Vocos]) -> None:
    dvae, _, vocos = models
    codes = [torch.randint(0, 625, (t, 4)) for t in (3, 7)]
    wavs = decode_codes_batch(dvae, vocos, codes)
    assert [len(w) for w in wavs] == [5 * 256, 13 * 256]
    alone = decode_codes_batch(dvae, vocos, codes[1:])[0]
    np.testing.assert_allclose(wavs[1], alone, atol=1e-6)  # the longest row sees no padding


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
