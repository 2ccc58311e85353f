"""The KV pool's size: a budget (bytes, or a fraction of free VRAM/RAM), never more than the sequences can use."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.loading.kv_sizing import (
    DEFAULT_KV_BYTES,
    DEFAULT_VRAM_FRACTION,
    budget_bytes,
    kv_cache_blocks,
)
from chattts_velocity.model import kv_cache_bytes_per_block

CHATTTS = ModelConfig()


def test_the_cuda_default_pool_is_capped_at_what_max_num_seqs_full_sequences_need(monkeypatch, caplog) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (76 * 2**30, 80 * 2**30))  # an idle H100
    config = EngineConfig.from_kwargs(device="cuda", dtype="bfloat16", max_num_seqs=64, max_model_len=4096)
    with caplog.at_level("INFO", logger="chattts_velocity"):
        blocks = kv_cache_blocks(CHATTTS, config)
    assert blocks == 64 * 4096 // 16  # 0.6 of 76 GiB would hold ~3x that
    per_block = kv_cache_bytes_per_block(20, 16, 12, 64, torch.bfloat16)
    assert abs(blocks * per_block / 2**30 - 15.0) < 0.1  # 64 x 4096 positions x 20 layers x K,V x 768 x 2 B
    assert any("KV cache: 16384 blocks" in r.getMessage() for r in caplog.records)


def test_an_explicit_budget_is_taken_as_given(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (76 * 2**30, 80 * 2**30))
    config = EngineConfig.from_kwargs(device="cuda", dtype="bfloat16", max_num_seqs=64, max_model_len=4096,
                                      kv_cache_memory=0.5)
    per_block = kv_cache_bytes_per_block(20, 16, 12, 64, torch.bfloat16)
    assert kv_cache_blocks(CHATTTS, config) == int(0.5 * 76 * 2**30 // per_block)


def test_the_kv_budget_on_cuda_is_a_fraction_of_free_vram(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 * 2**30, 80 * 2**30))  # (free, total)
    assert budget_bytes(0.5, "cuda") == 4 * 2**30  # half of what is free, not of the total
    assert budget_bytes(None, "cuda:0") == DEFAULT_VRAM_FRACTION * 8 * 2**30
    assert budget_bytes(None, "cpu") == DEFAULT_KV_BYTES
    assert budget_bytes(3 * 2**20, "cuda") == 3 * 2**20


def test_the_default_cpu_kv_pool_is_no_bigger_than_max_num_seqs_full_sequences() -> None:
    tiny = ModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=4, max_position_embeddings=4096)
    full = ModelConfig()
    engine = EngineConfig.from_kwargs(max_num_seqs=64, max_model_len=4096, block_size=16)
    assert kv_cache_blocks(tiny, engine) == 64 * 256  # was 65536 blocks: 1 GiB, all resident
    assert kv_cache_blocks(full, engine) == 2**30 // (16 * 20 * 2 * 768 * 4)  # 1 GiB, as before
    asked = EngineConfig.from_kwargs(max_num_seqs=64, max_model_len=4096, kv_cache_memory=2**30)
    assert kv_cache_blocks(tiny, asked) == 65536  # an explicit budget is taken as given


def test_a_budget_too_small_for_one_sequence_names_kv_cache_memory() -> None:
    config = EngineConfig.from_kwargs(max_model_len=4096, block_size=16, kv_cache_memory=2**20)
    with pytest.raises(ValueError, match="kv_cache_memory: 1.0 MiB holds .* max_model_len=4096 needs 256"):
        kv_cache_blocks(CHATTTS, config)
    with pytest.raises(ValueError, match="kv_cache_memory: must be > 0 bytes"):
        budget_bytes(-1, "cpu")


def test_the_pool_is_sized_in_the_precisions_kv_dtype() -> None:
    budget = {"kv_cache_memory": 2**30, "max_model_len": 4096}
    bf16 = kv_cache_blocks(CHATTTS, EngineConfig.from_kwargs(dtype="bfloat16", **budget))
    int8 = kv_cache_blocks(CHATTTS, EngineConfig.from_kwargs(dtype="bfloat16", kv_cache_dtype="int8", **budget))
    fp32 = kv_cache_blocks(CHATTTS, EngineConfig.from_kwargs(dtype="float32", **budget))
    assert bf16 == 2 * fp32 and bf16 < int8 < 2 * bf16  # an int8 row carries its scale's bytes too
