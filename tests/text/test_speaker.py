"""Speaker strings: base16384/LZMA bit-compatibility with upstream's strings, sampling, normalisation."""
from __future__ import annotations

import lzma
import math
import struct
from pathlib import Path

import numpy as np
import pybase16384 as b14
import pytest
import torch

from chattts_velocity.text import speaker
from chattts_velocity.text.speaker import (
    decode_prompt,
    decode_spk_emb,
    encode_prompt,
    encode_spk_emb,
    normalize_spk_emb,
    sample_random_speaker,
    seed_context,
)

FILTERS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]
STAT = np.load(Path(speaker.__file__).parent / "res" / "spk_stat.npy")  # [1536] float16: std, mean


def b14_reference(data: bytes) -> str:
    """base16384 written from the spec's description (MSB-first 7-byte groups, U+3D00+r marker)."""
    chars = []
    for start in range(0, len(data), 7):
        group = data[start : start + 7]
        bits = int.from_bytes(group.ljust(7, b"\0"), "big")  # 56 bits = 4 x 14
        values = [(bits >> (42 - 14 * k)) & 0x3FFF for k in range(4)]
        count = 4 if len(group) == 7 else math.ceil(8 * len(group) / 14)
        chars += [chr(0x4E00 + v) for v in values[:count]]
    if len(data) % 7:
        chars.append(chr(0x3D00 + len(data) % 7))
    return "".join(chars)


def lzma_raw(data: bytes) -> bytes:
    return lzma.compress(data, format=lzma.FORMAT_RAW, filters=FILTERS)


def test_b14_known_vectors() -> None:
    assert b14.encode_to_string(b"\x00") == "\u4e00\u3d01"
    assert b14.encode_to_string(b"\xff") == "\u8dc0\u3d01"
    assert b14_reference(b"\x00") == "\u4e00\u3d01" and b14_reference(b"\xff") == "\u8dc0\u3d01"


@pytest.mark.parametrize("length", [0, 1, 2, 6, 7, 8, 13, 14, 15, 100, 1536])
def test_b14_matches_spec_and_round_trips(length: int) -> None:
    data = np.random.default_rng(length).integers(0, 256, length, dtype=np.uint8).tobytes()
    encoded = b14.encode_to_string(data)
    assert encoded == b14_reference(data)
    assert b14.decode_from_string(encoded) == data


def test_encode_spk_emb_is_b14_of_raw_lzma2_fp16() -> None:
    x = torch.randn(768) * 4  # float32 in, stored as float16
    expected = b14_reference(lzma_raw(x.half().numpy().astype("<f2").tobytes()))
    assert encode_spk_emb(x) == expected
    assert expected.startswith("蘁淰")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_decode_inverts_encode_exactly(dtype: torch.dtype) -> None:
    x = (torch.randn(768) * 3).to(dtype)
    y = decode_spk_emb(encode_spk_emb(x))
    assert y.dtype == torch.float16 and y.shape == (768,)
    assert torch.equal(y.view(torch.int16), x.to(torch.float16).view(torch.int16))


def test_sample_random_speaker_formula_and_reproducibility() -> None:
    std, mean = STAT[:768], STAT[768:]
    strings = []
    for seed in (0, 1, 1234):
        torch.manual_seed(seed)
        s = sample_random_speaker()
        torch.manual_seed(seed)
        x = torch.randn(768, dtype=torch.float16).numpy()
        expected = (x * std) + mean  # two fp16-rounded ops, as upstream's mul_/add_
        assert s.startswith("蘁淰")
        assert np.array_equal(decode_spk_emb(s).numpy().view(np.int16), expected.view(np.int16))
        torch.manual_seed(seed)
        assert sample_random_speaker() == s
        strings.append(s)
    assert len(set(strings)) == 3


def test_sample_random_speaker_small_dim_uses_leading_stats() -> None:
    torch.manual_seed(5)
    s = sample_random_speaker(dim=64)
    torch.manual_seed(5)
    x = torch.randn(64, dtype=torch.float16).numpy()
    expected = (x * STAT[:64]) + STAT[768 : 768 + 64]
    assert np.array_equal(decode_spk_emb(s).numpy().view(np.int16), expected.view(np.int16))
    with pytest.raises(ValueError, match="dim"):
        sample_random_speaker(dim=769)


def test_seed_context_seeds_and_restores_cpu_state() -> None:
    torch.manual_seed(7)
    expected_after = torch.rand(4)
    torch.manual_seed(7)
    with seed_context(3):
        inside = sample_random_speaker()
    assert torch.equal(torch.rand(4), expected_after)
    torch.manual_seed(3)
    assert sample_random_speaker() == inside


@pytest.mark.parametrize("seed", range(8))
def test_normalize_spk_emb_is_fp16_norm_then_upcast(seed: int) -> None:
    torch.manual_seed(seed)
    x = decode_spk_emb(sample_random_speaker()).numpy()  # float16 [768]
    norm16 = np.float16(np.sqrt(np.sum(x.astype(np.float64) ** 2)))
    expected = (x.astype(np.float32) / np.float32(norm16)).astype(np.float16)
    got = normalize_spk_emb(torch.from_numpy(x))
    assert got.dtype == torch.float32 and got.shape == (768,)
    assert np.array_equal(got.numpy().astype(np.float16).view(np.int16), expected.view(np.int16))
    assert np.array_equal(got.numpy(), expected.astype(np.float32))


@pytest.mark.parametrize("steps", [1, 7, 50, 333])
def test_prompt_round_trip_and_layout(steps: int) -> None:
    codes = torch.randint(0, 626, (4, steps))
    s = encode_prompt(codes)
    raw = b14.decode_from_string(s)
    assert raw[:4] == struct.pack("<HH", 4, steps)
    body = lzma.decompress(raw[4:], format=lzma.FORMAT_RAW, filters=FILTERS)
    assert np.array_equal(np.frombuffer(body, dtype="<u2").reshape(4, steps), codes.numpy())
    assert s == b14_reference(raw[:4] + lzma_raw(codes.numpy().astype("<u2").tobytes()))
    out = decode_prompt(s)
    assert out.dtype == torch.int32 and torch.equal(out, codes.int())


def _valid_speaker() -> str:
    torch.manual_seed(0)
    return sample_random_speaker()


@pytest.mark.parametrize(
    "bad",
    ["", "abc", "蘁淰abc", "蘁淰", 123, None, "cut", "prompt"],
)
def test_malformed_speaker_raises_value_error(bad: object) -> None:
    if bad == "cut":
        bad = _valid_speaker()[:-6]
    elif bad == "prompt":
        bad = encode_prompt(torch.zeros(4, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="sample_random_speaker\\(\\), starting with 蘁淰") as info:
        decode_spk_emb(bad)
    assert info.value.__cause__ is None and "Error" not in str(info.value)


@pytest.mark.parametrize("bad", ["", "abc", "蘁淰abc", 7, "cut", "speaker"])
def test_malformed_prompt_raises_value_error(bad: object) -> None:
    if bad == "cut":
        bad = encode_prompt(torch.randint(0, 626, (4, 40)))[:-5]
    elif bad == "speaker":
        bad = _valid_speaker()
    with pytest.raises(ValueError, match="spk_smp") as info:
        decode_prompt(bad)
    assert info.value.__cause__ is None


@pytest.mark.parametrize(
    "bad",
    [torch.zeros(8, dtype=torch.int64), torch.zeros(4, 3), torch.full((4, 2), -1), torch.full((4, 2), 70000)],
)
def test_encode_prompt_rejects_bad_codes(bad: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="spk_smp"):
        encode_prompt(bad)


@pytest.mark.parametrize("bad", [torch.zeros(2, 768), torch.zeros(768, dtype=torch.int64), [0.0] * 768])
def test_encode_and_normalize_reject_non_vectors(bad: object) -> None:
    with pytest.raises(ValueError, match="spk_emb"):
        encode_spk_emb(bad)
    with pytest.raises(ValueError, match="spk_emb"):
        normalize_spk_emb(bad)


@pytest.mark.parametrize("bad,words", [(torch.zeros(8), "norm"), (torch.full((8,), float("nan")), "NaN"),
                                       (torch.tensor([1.0, float("inf")] + [0.0] * 6), "infinite"),
                                       (torch.full((8,), 1e-6), "norm")])
def test_speakers_the_model_cannot_use_are_refused(bad: torch.Tensor, words: str) -> None:
    from chattts_velocity.text import speaker_tensor

    with pytest.raises(ValueError, match=f"spk_emb: .*{words}"):
        speaker_tensor(bad, 8)
    with pytest.raises(ValueError, match="spk_emb"):
        speaker_tensor(encode_spk_emb(bad), 8)
    assert speaker_tensor(torch.randn(8), 8) is not None
