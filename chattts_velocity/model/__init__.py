"""Model stage: pure nn.Modules (Embed, the paged ChatTTSLlama) and their loaders; no engine imports."""
from __future__ import annotations

from chattts_velocity.model.attention import (
    AttentionMetadata,
    DecodeMetadata,
    allocate_kv_pairs,
    build_attention_metadata,
    kernel_decode_attention,
    kv_cache_bytes_per_block,
    paged_attention,
    paged_decode_attention,
    store_kvcache,
)
from chattts_velocity.model.embed import Embed
from chattts_velocity.model.fused import FusedDecoder, fused_unavailable
from chattts_velocity.model.llama import ChatTTSLlama
from chattts_velocity.model.loader import load_embed, load_gpt
from chattts_velocity.model.packed import PackedLinear

__all__ = [
    "AttentionMetadata",
    "ChatTTSLlama",
    "DecodeMetadata",
    "Embed",
    "FusedDecoder",
    "PackedLinear",
    "allocate_kv_pairs",
    "build_attention_metadata",
    "fused_unavailable",
    "kernel_decode_attention",
    "kv_cache_bytes_per_block",
    "load_embed",
    "load_gpt",
    "paged_attention",
    "paged_decode_attention",
    "store_kvcache",
]
