"""Model stage: pure nn.Modules (Embed, the paged ChatTTSLlama) and their loaders; no engine imports."""
from __future__ import annotations

from chattts_velocity.model.attention import (
    AttentionMetadata,
    DecodeMetadata,
    allocate_kv_cache,
    allocate_kv_pairs,
    build_attention_metadata,
    forward_context,
    get_forward_context,
    kv_cache_bytes_per_block,
    paged_attention,
    paged_decode_attention,
    store_kvcache,
)
from chattts_velocity.model.embed import Embed
from chattts_velocity.model.llama import ChatTTSLlama
from chattts_velocity.model.loader import load_embed, load_gpt
from chattts_velocity.model.packed import PackedLinear

__all__ = [
    "AttentionMetadata",
    "ChatTTSLlama",
    "DecodeMetadata",
    "Embed",
    "allocate_kv_cache",
    "allocate_kv_pairs",
    "build_attention_metadata",
    "forward_context",
    "get_forward_context",
    "kv_cache_bytes_per_block",
    "load_embed",
    "load_gpt",
    "PackedLinear",
    "paged_attention",
    "paged_decode_attention",
    "store_kvcache",
]
