"""Hostile text and strings for the text stage: decoders with an output bound, normalisation linear in its input,
a time budget that ends over-long work, and SSML numbers too long to read."""
from __future__ import annotations

import lzma
import struct
import time

import pybase16384 as b14
import pytest
import torch
from timing import cpu_unit

from chattts_velocity.text import Normalizer, decode_prompt, decode_spk_emb, encode_prompt
from chattts_velocity.text.budget import TextBudgetExceeded, time_budget
from chattts_velocity.text.numbers import MAX_WETEXT_CHARS, SpokenText, bounded_chunks
from chattts_velocity.text.speaker import MAX_CLIP_FRAMES, MAX_SPEAKER_CHARS
from chattts_velocity.text.ssml import parse_ssml

LZMA2 = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]
# each case at the server's largest input (4096 characters); each used to take seconds, growing faster than its length
HOSTILE_UNITS = ["9 ", "-", "+1-555-555-5555 ", "1", " ,", "1,000,"]


def _compressed(payload: bytes, head: bytes = b"") -> str:
    return b14.encode_to_string(head + lzma.compress(payload, format=lzma.FORMAT_RAW, filters=LZMA2))


def test_a_speaker_bomb_is_refused_without_decompressing_it() -> None:
    """The three refusals together cost under 25 units of plain Python work (cpu_unit, this run, ~50 ms on the
    reference host): each takes well under a millisecond, and decompressing the 64 MiB bomb costs over 100 units."""
    bomb = _compressed(bytes(64 << 20))  # 64 MiB of zeros in ~5,600 characters
    small_bomb = _compressed(bytes(1 << 20))  # 1 MiB in 130 characters: the output bound refuses it
    started = time.process_time()
    with pytest.raises(ValueError, match="^speaker: .*over the limit|^speaker: decodes to more than"):
        decode_spk_emb(bomb)
    with pytest.raises(ValueError, match="^speaker: decodes to more than 8192 bytes"):
        decode_spk_emb(small_bomb)
    with pytest.raises(ValueError, match=f"^speaker: .* over the limit of {MAX_SPEAKER_CHARS}"):
        decode_spk_emb("蘁淰" * MAX_SPEAKER_CHARS)
    spent, unit = time.process_time() - started, cpu_unit()
    assert spent < 25 * unit, (spent, unit)


@pytest.mark.parametrize("rows, cols", [(1000, 65535), (4, 65535), (3, 10), (4, 0), (4, MAX_CLIP_FRAMES + 1)])
def test_a_clip_code_of_an_unusable_shape_is_refused_before_decompressing(rows: int, cols: int) -> None:
    with pytest.raises(ValueError, match=rf"^spk_smp: the codes are \[{rows}, {cols}\]"):
        decode_prompt(_compressed(bytes(2 * rows * cols), struct.pack("<HH", rows, cols)))


def test_clip_codes_past_the_model_audio_tokens_are_refused() -> None:
    assert decode_prompt(encode_prompt(torch.full((4, 5), 625))).max() == 625
    with pytest.raises(ValueError, match=r"^spk_smp: holds the code 65535; clip codes are 0\.\.625"):
        decode_prompt(encode_prompt(torch.full((4, 5), 65535)))


def test_decoded_values_cannot_be_changed_through_the_cache() -> None:
    speaker = _compressed(torch.ones(8, dtype=torch.float16).numpy().tobytes())
    decode_spk_emb(speaker).zero_()
    assert decode_spk_emb(speaker).tolist() == [1.0] * 8


@pytest.mark.parametrize("text", ["", "short", "a b " * 100, "-" * 300, "word " * 13 + "x" * 200])
def test_bounded_chunks_join_back_and_cut_at_whitespace(text: str) -> None:
    chunks = bounded_chunks(text, MAX_WETEXT_CHARS)
    assert "".join(chunks) == text and all(len(c) <= MAX_WETEXT_CHARS for c in chunks)
    assert all(c[-1].isspace() for c in chunks[:-1] if any(ch.isspace() for ch in c))


@pytest.fixture(scope="module")
def normalizer() -> Normalizer:
    pytest.importorskip("wetext")
    return Normalizer()


@pytest.mark.parametrize("unit", HOSTILE_UNITS)
def test_normalisation_is_linear_in_its_input(normalizer: Normalizer, unit: str) -> None:
    """8x the text costs about 8x the CPU time, and 4,096 characters cost under 40x a fixed piece of plain Python
    work (timing.cpu_unit; 4-12x measured, it was 75-630x): both against the same run's measurements, never absolute
    seconds, so a slow host passes. wetext's memo is emptied first, so a repeated unit is read for real."""
    def cost(chars: int) -> float:
        text = (unit * (chars // len(unit) + 1))[:chars]
        for fn in normalizer.normalizers.values():
            if isinstance(fn, SpokenText):
                fn.forget()
        started = time.process_time()
        normalizer(text)
        return time.process_time() - started

    cost(256)  # first-call costs
    small, large, work = min(cost(512) for _ in range(3)), min(cost(4096) for _ in range(2)), cpu_unit()
    assert large / 4096 < 2.5 * max(small, work) / 512, (small, large, work)  # per character, at most 2.5x
    assert large < 40 * work, (large, work)


def test_the_time_budget_ends_long_work(normalizer: Normalizer) -> None:
    numbers = " ".join(f"{k * 7919 % 100_000} kg" for k in range(800))  # 800 weights, none repeated: wetext reads all
    with time_budget(0.05), pytest.raises(TextBudgetExceeded, match=r"^input: preparing the text took over"):
        normalizer(numbers)
    with time_budget(60):
        assert normalizer("9 " * 10).startswith("nine")


def test_say_as_numbers_too_long_to_read_are_refused() -> None:
    pytest.importorskip("wetext")
    assert "thousand" in parse_ssml('<speak><say-as interpret-as="cardinal">1234</say-as></speak>').text
    with pytest.raises(ValueError, match="^input: .*holds a 4000-digit number; numbers of up to 36 digits"):
        parse_ssml('<speak><say-as interpret-as="cardinal">' + "7" * 4000 + "</say-as></speak>")
