"""The seed contract at the bytes of a WAV: one seeded text gives the same WAV bytes alone, among 8 and among 32 texts
(Chat.infer), in float32 and bf16, on every CPU kernel ISA this host can force (CHATTTS_VELOCITY_CPU_KERNELS). The
tiny checkpoint runs the torch backend (batch-invariant GEMM tiles and per-sequence attention) and the per-row audio
decode; the full-size checkpoint (slow) runs the cpu backend in bf16 and int8, the torch backend in float32; with the
default audio decode of an int8 GPT (bf16 on the ISA's C++ path) too."""
from __future__ import annotations

from pathlib import Path

import pytest

from chattts_velocity import Chat, InferCodeParams
from chattts_velocity.audio.encode import wav_bytes
from chattts_velocity.model import kernels

TARGET = "The request we follow, word for word, from its first sound to its very last one."
OTHERS = [f"Another sentence, number {i}, rather longer than the first." if i % 2 else f"Short line {i}."
          for i in range(31)]


FORCED_ISAS = list(kernels.SWITCH_VALUES[2:5])  # noamx, avx512, avx2 (each skipped where the CPU lacks it)


def _force(isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernels.ENV_SWITCH, isa)
    if kernels.unsupported() is not None or kernels.isa() is None:
        pytest.skip(f"the {isa} kernels cannot run here: {kernels.unsupported()}")


def _target_bytes_among(chat: Chat, sizes: tuple[int, ...], steps: int) -> list[bytes]:
    """The target's WAV bytes alone (size 1) and in the middle of each batch size, sampled with one seed. Its prompt
    spans several KV blocks, so every run after the first finds them in the prefix cache and computes the rest."""
    params = InferCodeParams(manual_seed=7, max_new_token=steps, temperature=0.7, show_tqdm=False)
    out = []
    for size in sizes:
        texts = OTHERS[: size // 2] + [TARGET] + OTHERS[size // 2: size - 1]
        wav = chat.infer(texts, skip_refine_text=True, params_infer_code=params, use_vllm=True)[size // 2]
        out.append(wav_bytes(wav))
    return out


def _chat(assets: Path, dtype: str, decode_dtype: str | None = "float32") -> Chat:
    chat = Chat()
    assert chat.load(source="custom", custom_path=assets, verify=False, dtype=dtype, use_vllm=True,
                     decode_dtype=decode_dtype)
    return chat


def test_a_seeded_text_gives_the_same_wav_bytes_alone_among_8_and_again(tiny_assets: Path) -> None:
    chat = _chat(tiny_assets, "float32")
    assert chat.engine().runner.backend.name == "torch"
    among8, alone, again = _target_bytes_among(chat, (8, 1, 1), steps=8)  # the first run computes the whole prompt
    assert len(alone) > 44 + 2 * 256 and among8 == alone == again


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_seeded_text_gives_the_same_wav_bytes_alone_among_8_and_among_32(tiny_assets: Path, dtype: str) -> None:
    alone, among8, among32 = _target_bytes_among(_chat(tiny_assets, dtype), (1, 8, 32), steps=16)
    assert among8 == alone and among32 == alone


@pytest.mark.slow
@pytest.mark.parametrize("isa", FORCED_ISAS)
def test_the_same_wav_bytes_with_the_default_audio_decode_on_every_forced_kernel_isa(
        tiny_assets: Path, isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """int8 GPT, the audio decode's default there: bf16 on the ISA's C++ path (oneDNN bf16, or bf16 weights in fp32
    arithmetic with the rows batched on AVX2)."""
    _force(isa, monkeypatch)
    chat = _chat(tiny_assets, "int8", decode_dtype=None)
    assert "audio decode bfloat16" in chat.pipeline.precision.describe()
    alone, among8, among32 = _target_bytes_among(chat, (1, 8, 32), steps=16)
    assert among8 == alone and among32 == alone


@pytest.mark.slow
@pytest.mark.parametrize("isa", FORCED_ISAS)
def test_the_same_wav_bytes_on_every_forced_kernel_isa(tiny_assets: Path, isa: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _force(isa, monkeypatch)
    alone, among8, among32 = _target_bytes_among(_chat(tiny_assets, "bfloat16"), (1, 8, 32), steps=16)
    assert among8 == alone and among32 == alone


@pytest.mark.slow
@pytest.mark.parametrize("isa", FORCED_ISAS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_full_size_seeded_text_gives_the_same_wav_bytes_in_any_batch(full_assets: Path, isa: str, dtype: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _force(isa, monkeypatch)
    alone, among8, among32 = _target_bytes_among(_chat(full_assets, dtype), (1, 8, 32), steps=16)
    assert among8 == alone and among32 == alone
