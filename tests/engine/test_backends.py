"""The decode backend (worker/backends/select.py): chosen once from EngineConfig.backend, never a silent fallback, and
every backend's decode step gives the eager torch path's hidden states and KV rows. The model has head_dim 32,
which the C++ kernels need."""
from __future__ import annotations

import logging

import pytest
import torch
from backend_lists import decode, forward

from chattts_velocity import load_pretrained
from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.loading.weights import pack_for
from chattts_velocity.engine.worker.backends.select import select_backend
from chattts_velocity.engine.worker.backends.torch_backend import TorchBackend
from chattts_velocity.engine.worker.step_inputs import PagedKV
from chattts_velocity.model import (
    ChatTTSLlama,
    allocate_kv_pairs,
    build_attention_metadata,
    kernel_decode_attention,
    kernels,
    paged_decode_attention,
)
from chattts_velocity.precision import Precision

UNSUPPORTED = kernels.unsupported()
needs_kernels = pytest.mark.skipif(UNSUPPORTED is not None, reason=f"CPU kernels unsupported here: {UNSUPPORTED}")
HIDDEN, HEADS, BLOCK, NUM_BLOCKS = 128, 4, 4, 32
CONFIG = ModelConfig(hidden_size=HIDDEN, intermediate_size=256, num_hidden_layers=2, num_attention_heads=HEADS,
                     num_key_value_heads=HEADS, max_position_embeddings=512)


def _model(dtype: str, config: ModelConfig = CONFIG) -> ChatTTSLlama:
    """Random weights in dtype's weight precision, packed as LLMEngine packs them."""
    precision = Precision.decide(dtype)
    gen = torch.Generator().manual_seed(0)
    model = ChatTTSLlama(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    model = model.to(precision.weights).eval()
    model.rotary_emb.float().reset_tables()
    pack_for(model, precision)
    return model


def _select(dtype: str, config: ModelConfig = CONFIG, **options):
    model = _model(dtype, config)
    pairs = allocate_kv_pairs(config.num_hidden_layers, NUM_BLOCKS + 1, BLOCK, config.num_attention_heads,
                              config.head_dim, Precision.decide(dtype).kv_cache)
    kv = PagedKV(pairs, BLOCK, pad_block=NUM_BLOCKS, device=torch.device("cpu"))
    return select_backend(EngineConfig.from_kwargs(dtype=dtype, block_size=BLOCK, **options), model, kv), kv


def test_auto_runs_float32_engines_on_eager_torch() -> None:
    backend, _ = _select("float32")
    assert isinstance(backend, TorchBackend) and backend.name == "torch"


@needs_kernels
@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_auto_runs_bf16_and_int8_engines_on_the_fused_cpu_layers(dtype: str) -> None:
    assert _select(dtype)[0].name == "cpu"
    assert _select(dtype, compile=True)[0].name == "cpu"  # compile is the torch backend's knob


def test_auto_without_the_kernels_runs_torch_and_asking_for_cpu_says_why(monkeypatch) -> None:
    monkeypatch.setenv(kernels.ENV_SWITCH, "0")
    assert _select("bfloat16")[0].name == "torch"
    with pytest.raises(ValueError, match=f"backend: 'cpu' cannot run here: .*{kernels.ENV_SWITCH}=0"):
        _select("bfloat16", backend="cpu")


def test_cpu_backend_on_a_float32_engine_is_an_error() -> None:
    with pytest.raises(ValueError, match="backend: 'cpu' cannot run here: .*bfloat16 KV cache"):
        _select("float32", backend="cpu")


@needs_kernels
def test_cpu_backend_needs_head_dim_a_multiple_of_32() -> None:
    config = ModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                         max_position_embeddings=64)  # head_dim 16
    with pytest.raises(ValueError, match="backend: 'cpu' cannot run here: head_dim 16"):
        _select("bfloat16", config, backend="cpu")
    assert _select("bfloat16", config)[0].name == "torch"


def test_unknown_backends_are_rejected() -> None:  # triton's own errors: tests/engine/test_triton_backend.py
    with pytest.raises(ValueError, match="backend: must be one of auto, torch, cpu, triton, got 'gpu'"):
        EngineConfig.from_kwargs(backend="gpu")


@pytest.mark.parametrize("options, words", [
    ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype: must be one of auto, int8, got 'fp8'"),
    ({"kv_cache_dtype": "int8"}, "kv_cache_dtype: 'int8' runs only on the cpu backend .* dtype='float32'"),
    ({"kv_cache_dtype": "int8", "dtype": "bfloat16", "backend": "torch"}, "backend='torch'"),
    ({"kv_cache_dtype": "int8", "dtype": "int8", "device": "cuda"}, "device='cuda'"),
])
def test_int8_kv_cache_outside_the_cpu_backend_is_a_clear_error(options: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        EngineConfig.from_kwargs(**options)


def test_int8_kv_cache_without_the_kernels_says_why(monkeypatch) -> None:
    monkeypatch.setenv(kernels.ENV_SWITCH, "0")
    model = _model("bfloat16")
    pairs = allocate_kv_pairs(2, NUM_BLOCKS + 1, BLOCK, HEADS, HIDDEN // HEADS, torch.int8)
    kv = PagedKV(pairs, BLOCK, pad_block=NUM_BLOCKS, device=torch.device("cpu"))
    config = EngineConfig.from_kwargs(dtype="bfloat16", kv_cache_dtype="int8", block_size=BLOCK)
    with pytest.raises(ValueError, match=f"kv_cache_dtype: 'int8' needs the cpu backend, .*{kernels.ENV_SWITCH}=0"):
        select_backend(config, model, kv)


def test_int8_kv_cache_on_the_plain_path_is_refused(tiny_assets) -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype=int8.*only apply to the velocity engine"):
        load_pretrained(tiny_assets, is_vllm=False, kv_cache_dtype="int8")


def test_engine_reports_and_logs_its_backend_once(tiny_assets, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="chattts_velocity"):
        llm = load_pretrained(tiny_assets, is_vllm=True, backend="torch")
    assert llm.engine.metrics()["backend"] == "torch"
    assert [r.getMessage() for r in caplog.records].count("decode backend: torch") == 1


CASES = [
    pytest.param("float32", {"compile": True}, "torch.compile", 1e-5, id="float32-compiled",
                 marks=pytest.mark.slow),  # a cold inductor compile (tests/engine/test_compile.py keeps one by default)
    pytest.param("bfloat16", {"compile": True, "backend": "torch"}, "torch.compile", 1e-2, id="bfloat16-compiled",
                 marks=pytest.mark.slow),  # a cold inductor compile: the slow suite
    pytest.param("bfloat16", {"backend": "cpu"}, "cpu", 1e-2, marks=needs_kernels, id="bfloat16-cpu"),
    pytest.param("int8", {"backend": "cpu"}, "cpu", 1e-2, marks=needs_kernels, id="int8-cpu"),
]


@pytest.mark.parametrize("lens", [[7], [5, 9, 2]])  # one sequence: compiled steps pad it to MIN_DYNAMIC
@pytest.mark.parametrize("dtype,options,name,tolerance", CASES)
@torch.inference_mode()
def test_decode_equals_the_eager_torch_path(dtype, options, name, tolerance, lens) -> None:
    backend, kv = _select(dtype, **options)
    assert backend.name == name
    # the attention of DecodeMetadata steps follows the backend: the C++ kernel in compiled bf16 steps
    kernel_attends = name == "torch.compile" and dtype == "bfloat16" and UNSUPPORTED is None
    expected_attention = kernel_decode_attention if kernel_attends else paged_decode_attention
    assert all(layer.self_attn.decode_attention is expected_attention for layer in backend.model.layers)
    tables = [list(range(b * 4, b * 4 + 4)) for b in range(len(lens))]  # 16 positions each
    gen = torch.Generator().manual_seed(1)
    meta = build_attention_metadata(lens, lens, tables, BLOCK)
    forward(backend, torch.randn(sum(lens), HIDDEN, generator=gen), meta)  # prefill: the same path in all backends
    eager_kv = PagedKV([(k.clone(), v.clone()) for k, v in kv.pairs], BLOCK, kv.pad_block, kv.device)
    eager = TorchBackend(backend.model, eager_kv)
    for step in range(3):  # later steps read K/V that earlier decode steps wrote
        positions = [n + step for n in lens]
        trimmed = [t[: p // BLOCK + 1] for t, p in zip(tables, positions, strict=True)]
        x = torch.randn(len(lens), HIDDEN, generator=gen)
        got, expected = decode(backend, x, positions, trimmed), decode(eager, x, positions, trimmed)
        assert got.shape == expected.shape == (len(lens), HIDDEN)
        assert (got.float() - expected.float()).abs().max().item() <= tolerance * expected.abs().max().item()
    # the new K/V rows landed where eager put them
    for pools, eager_pools in zip(kv.pairs, eager_kv.pairs, strict=True):
        for pool, eager_pool in zip(pools, eager_pools, strict=True):
            pool, eager_pool = pool[:NUM_BLOCKS].float(), eager_pool[:NUM_BLOCKS].float()
            assert (pool - eager_pool).abs().max().item() <= 2**-7 * eager_pool.abs().max().item()
