"""The KV pool's size: a budget (bytes, or a fraction of free VRAM/RAM), never more than the sequences can use."""
from __future__ import annotations

import torch

from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.llm_engine import kv_cache_blocks
from chattts_velocity.model import kv_cache_bytes_per_block

CHATTTS = ModelConfig()


def test_the_cuda_default_pool_is_capped_at_what_max_num_seqs_full_sequences_need(monkeypatch, caplog) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (76 * 2**30, 80 * 2**30))  # an idle H100
    config = EngineConfig(device="cuda", dtype="bfloat16", max_num_seqs=64, max_model_len=4096)
    with caplog.at_level("INFO", logger="chattts_velocity"):
        blocks = kv_cache_blocks(CHATTTS, config, torch.bfloat16)
    assert blocks == 64 * 4096 // 16  # 0.6 of 76 GiB would hold ~3x that
    per_block = kv_cache_bytes_per_block(20, 16, 12, 64, torch.bfloat16)
    assert abs(blocks * per_block / 2**30 - 15.0) < 0.1  # 64 x 4096 positions x 20 layers x K,V x 768 x 2 B
    assert any("KV cache: 16384 blocks" in r.getMessage() for r in caplog.records)


def test_an_explicit_budget_is_taken_as_given(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (76 * 2**30, 80 * 2**30))
    config = EngineConfig(device="cuda", dtype="bfloat16", max_num_seqs=64, max_model_len=4096, kv_cache_memory=0.5)
    per_block = kv_cache_bytes_per_block(20, 16, 12, 64, torch.bfloat16)
    assert kv_cache_blocks(CHATTTS, config, torch.bfloat16) == int(0.5 * 76 * 2**30 // per_block)
