"""DVAE / Decoder: decode and encode wiring, strict loading, and the official checkpoints' full-size key/shape table."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from audio_state_dicts import decoder_shapes, dvae_shapes, vocos_shapes
from safetensors.torch import save_file

from chattts_velocity.audio import DVAE, Decoder, Vocos, load_safetensors


def explicit_interleave(x: torch.Tensor) -> torch.Tensor:  # [B, 2C, T] -> [B, C, 2T]
    c = x.shape[1] // 2
    return torch.stack([x[:, :c], x[:, c:]], dim=-1).flatten(2)


def test_decoder_matches_explicit_path(decoder_sd: dict[str, torch.Tensor]) -> None:
    dec = Decoder.from_state_dict(decoder_sd)
    hidden = torch.randn(2, 64, 7)
    mel = dec(hidden)
    assert mel.shape == (2, 100, 14)
    expected = F.conv1d(dec.decoder(explicit_interleave(hidden)), decoder_sd["out_conv.weight"], padding=1)
    torch.testing.assert_close(mel, expected * decoder_sd["coef"])


def test_dvae_decode_matches_explicit_path(dvae_sd: dict[str, torch.Tensor]) -> None:
    dvae = DVAE.from_state_dict(dvae_sd)
    codes = torch.randint(0, 625, (2, 4, 6), generator=torch.Generator().manual_seed(0))
    mel = dvae.decode(codes)
    assert mel.shape == (2, 100, 12)
    feats = dvae.vq_layer.decode(codes)  # [2, 64, 6]
    expected = F.conv1d(dvae.decoder(explicit_interleave(feats)), dvae_sd["out_conv.weight"], padding=1)
    torch.testing.assert_close(mel, expected * dvae_sd["coef"])


def test_dvae_encode_matches_explicit_front_end(dvae_sd: dict[str, torch.Tensor]) -> None:
    dvae = DVAE.from_state_dict(dvae_sd)
    wav = 0.3 * torch.randn(24000, generator=torch.Generator().manual_seed(5))
    codes = dvae.encode(wav.numpy())
    # 1 s -> F = 94 mel frames -> T = 47 codes (2 frames per code)
    assert codes.shape == (4, 47) and codes.dtype == torch.int32
    window = dvae_sd["preprocessor_mel.mel_spec.spectrogram.window"]
    spec = torch.stft(wav, 1024, 256, 1024, window, center=True, pad_mode="reflect", return_complex=True)
    mel = torch.matmul(spec.abs().T, dvae_sd["preprocessor_mel.mel_spec.mel_scale.fb"]).T  # [100, 94]
    x = torch.log(mel.clamp(min=1e-5)) / dvae_sd["coef"][0]
    x = F.gelu(F.conv1d(x[None], dvae_sd["downsample_conv.0.weight"], dvae_sd["downsample_conv.0.bias"], padding=1))
    x = F.gelu(F.conv1d(x, dvae_sd["downsample_conv.2.weight"], dvae_sd["downsample_conv.2.bias"],
                        stride=2, padding=1))
    assert x.shape == (1, 32, 47)
    assert torch.equal(codes, dvae.vq_layer.encode(dvae.encoder(x))[0])
    assert len(set(codes.flatten().tolist())) > 4


def test_encode_rejects_bad_clips(dvae_sd: dict[str, torch.Tensor]) -> None:
    dvae = DVAE.from_state_dict(dvae_sd)
    with pytest.raises(ValueError, match="1-D"):
        dvae.encode(torch.zeros(2, 24000))
    with pytest.raises(ValueError, match="samples"):
        dvae.encode(torch.zeros(300))


def test_decoder_rejects_wrong_hidden_width(decoder_sd: dict[str, torch.Tensor]) -> None:
    with pytest.raises(ValueError, match=r"\[B, 64, T\]"):
        Decoder.from_state_dict(decoder_sd)(torch.randn(1, 7, 64))


@pytest.mark.parametrize(("cls", "fixture", "sizing_key"), [
    (DVAE, "dvae_sd", "encoder.conv_in.0.weight"),
    (Decoder, "decoder_sd", "out_conv.weight"),
    (Vocos, "vocos_sd", "backbone.embed.weight"),
])
def test_strict_loading_names_the_bad_key(cls: type, fixture: str, sizing_key: str,
                                          request: pytest.FixtureRequest) -> None:
    sd = request.getfixturevalue(fixture)
    missing = dict(sd)
    key = sorted(k for k in sd if k.endswith("norm.bias"))[0]
    del missing[key]
    with pytest.raises(ValueError, match=f"missing keys.*{key}"):
        cls.from_state_dict(missing)
    with pytest.raises(ValueError, match="unexpected keys.*stray.weight"):
        cls.from_state_dict(sd | {"stray.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match=f"missing key '{sizing_key}'"):
        cls.from_state_dict({k: v for k, v in sd.items() if k != sizing_key})
    wrong = dict(sd)
    wrong[key] = torch.zeros(wrong[key].shape[0] + 1)
    with pytest.raises(ValueError, match="shape"):
        cls.from_state_dict(wrong)


def test_loaded_values_and_no_extra_buffers(dvae_sd: dict[str, torch.Tensor]) -> None:
    dvae = DVAE.from_state_dict(dvae_sd)
    state = dvae.state_dict()
    assert set(state) == set(dvae_sd)
    assert all(torch.equal(state[k], v) for k, v in dvae_sd.items())
    names = {n for n, _ in dvae.named_buffers()}
    assert {"vq_layer.quantizer.rvqs.0.scales", "vq_layer.quantizer.rvqs.0.levels"} <= names  # non-persistent


def test_load_safetensors_upcasts_to_float32(tmp_path: Path, decoder_sd: dict[str, torch.Tensor]) -> None:
    half = {k: v.half() for k, v in decoder_sd.items()}
    save_file(half, str(tmp_path / "Decoder.safetensors"))
    sd = load_safetensors(tmp_path / "Decoder.safetensors")
    assert all(v.dtype == torch.float32 for v in sd.values())
    dec = Decoder.from_state_dict(sd)
    assert torch.equal(dec.coef, half["coef"].float())
    with pytest.raises(FileNotFoundError):
        load_safetensors(tmp_path / "missing.safetensors")


FULL = [  # the official files: file, tensors, total numel, table
    (DVAE, 242, 15_083_472, dvae_shapes(dim=512, hidden=256, bn=128, n_layer=12)),
    (Decoder, 115, 25_920_740, decoder_shapes(idim=384, hidden=512, bn=128, n_layer=12)),
    (Vocos, 83, 13_584_998, vocos_shapes(dim=512, inter=1536, n_layer=8)),
]


@pytest.mark.parametrize(("cls", "count", "numel", "table"), FULL)
def test_full_size_keys_and_shapes(cls: type, count: int, numel: int, table: dict) -> None:
    assert len(table) == count and sum(math.prod(s) for s in table.values()) == numel
    meta_sd = {k: torch.empty(s, device="meta") for k, s in table.items()}
    with torch.device("meta"):
        module = cls.sized_like(meta_sd)
    assert {k: tuple(v.shape) for k, v in module.state_dict().items()} == table
