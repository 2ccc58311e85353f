"""Precision.decide: every dtype of a loaded model from the user's choices (cpu/cuda x dtype x KV x decode dtype)."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity import precision
from chattts_velocity.precision import Precision

BF16, F16, F32, I8 = torch.bfloat16, torch.float16, torch.float32, torch.int8

# (device, dtype, kv_cache_dtype) -> (weights, packing, kv_cache, activations, audio decode by default)
DECISIONS = [
    ("cpu", "float32", "auto", F32, None, F32, F32, None),
    ("cpu", "bfloat16", "auto", BF16, "bfloat16", BF16, F32, None),  # audio: bf16 only where a C++ path runs
    ("cpu", "bfloat16", "int8", BF16, "bfloat16", I8, F32, None),
    ("cpu", "float16", "auto", F16, "float16", F16, F32, None),
    ("cpu", "int8", "auto", BF16, "int8", BF16, F32, None),
    ("cpu", "int8", "int8", BF16, "int8", I8, F32, None),
    ("cpu", "int4", "auto", BF16, "int4", BF16, F32, None),
    ("cpu", "int4", "int8", BF16, "int4", I8, F32, None),
    ("cuda", "float32", "auto", F32, None, F32, F32, BF16),
    ("cuda", "bfloat16", "auto", BF16, None, BF16, BF16, BF16),  # cuBLAS on the loaded weights: nothing packed
    ("cuda", "float16", "auto", F16, None, F16, F16, BF16),
    ("cuda:1", "int8", "auto", BF16, "int8", BF16, BF16, BF16),
    ("cuda", "int4", "auto", BF16, "int4", BF16, BF16, BF16),
]


@pytest.mark.parametrize("device,dtype,kv,weights,packing,kv_cache,activations,audio", DECISIONS)
def test_the_decisions_table(device, dtype, kv, weights, packing, kv_cache, activations, audio) -> None:
    p = Precision.decide(dtype, kv, device=device)
    assert (p.dtype, p.weights, p.packing, p.kv_cache, p.activations, p.audio) == \
        (dtype, weights, packing, kv_cache, activations, audio)
    assert p.exact == (dtype == "float32")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_decode_dtype_overrides_the_audio_default(device: str, dtype: str) -> None:
    assert Precision.decide(dtype, decode_dtype="float32", device=device).audio is None
    assert Precision.decide(dtype, decode_dtype="bfloat16", device=device).audio == BF16


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8", "int4"])
def test_a_cpu_with_a_bf16_audio_path_decodes_audio_in_bf16_with_a_reduced_gpt(dtype: str) -> None:
    reduced = BF16 if dtype in ("bfloat16", "int8", "int4") else None
    assert Precision.decide(dtype, device="cpu", cpu_bf16=True).audio == reduced  # bf16 arithmetic
    assert Precision.decide(dtype, device="cpu", cpu_kernels=True).audio == reduced  # AVX2, NEON: bf16 weights
    assert Precision.decide(dtype, device="cpu", cpu_kernels=False).audio is None  # no C++ path: exact float32
    assert Precision.decide(dtype, device="cuda", cpu_bf16=False).audio == BF16


def test_auto_is_the_fastest_accepted_precision_of_the_device() -> None:
    assert Precision.decide("auto", device="cuda", cpu_kernels=False).dtype == "bfloat16"
    assert Precision.decide("auto", device="cpu", cpu_kernels=True).dtype == "int8"
    assert Precision.decide("auto", device="cpu", cpu_kernels=False).dtype == "float32"
    assert precision.fastest_dtype("mps", True) == "float32"
    with pytest.raises(ValueError, match="dtype: 'auto' is resolved where the kernels are known"):
        Precision.decide("auto")  # the engine's config: it cannot know, so it takes a name


@pytest.mark.parametrize("choices,error", [
    ({"dtype": "fp8"}, "dtype: must be auto, float32, bfloat16, float16, int8 or int4, got 'fp8'"),
    ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype: must be one of auto, int8, got 'fp8'"),
    ({"decode_dtype": "float16"}, "decode_dtype: must be 'bfloat16', 'float32' or None, got 'float16'"),
    ({"kv_cache_dtype": "int8"}, "kv_cache_dtype: 'int8' runs only on the cpu backend .* dtype='float32'"),
    ({"kv_cache_dtype": "int8", "dtype": "float16"}, "kv_cache_dtype: 'int8' .* dtype='float16'"),
    ({"kv_cache_dtype": "int8", "dtype": "int8", "backend": "torch"}, "kv_cache_dtype: 'int8' .* backend='torch'"),
    ({"kv_cache_dtype": "int8", "dtype": "int8", "device": "cuda"}, "kv_cache_dtype: 'int8' .* device='cuda'"),
])
def test_a_choice_that_cannot_be_names_its_field(choices: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Precision.decide(**choices)


def test_the_description_names_every_stage_once() -> None:
    line = Precision.decide("int8", "int8", device="cpu", cpu_bf16=True).describe()
    assert line == ("precision int8 on cpu: weights bfloat16, packed int8 linears, KV cache int8, activations float32, "
                    "audio decode bfloat16")
    assert "\n" not in line
    assert Precision.decide("float32").describe() == ("precision float32 on cpu: weights float32, KV cache float32, "
                                                      "activations float32, audio decode float32")


def test_the_engine_config_reads_the_same_decision() -> None:
    from chattts_velocity.config import EngineConfig

    config = EngineConfig.from_kwargs(dtype="int4", kv_cache_dtype="int8")
    assert config.precision == Precision.decide("int4", "int8", device="cpu")


def test_the_device_is_part_of_the_decision() -> None:
    import torch

    assert Precision.decide(device="cpu").device == torch.device("cpu")
    want = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert Precision.decide(device=None).device == want  # None: CUDA when there is one


def test_a_decided_precision_cannot_be_changed_by_strings() -> None:
    from chattts_velocity.config import EngineConfig

    with pytest.raises(ValueError, match="^precision: decided already"):
        EngineConfig.from_kwargs(precision=Precision.decide(), dtype="bfloat16")
