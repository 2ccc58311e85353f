"""The GPT backbone with a paged KV cache: embeddings of the new positions in, final-norm hidden states out.

Parameter names equal the keys of asset/gpt/model.safetensors (HF `LlamaModel` without `embed_tokens`).
The step's AttentionMetadata comes from `forward_context`; see attention.py for the KV pool layout.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from chattts_velocity.config import ModelConfig
from chattts_velocity.model.attention import get_forward_context, paged_attention, store_kvcache
from chattts_velocity.model.layers import LlamaMLP, RMSNorm, RotaryEmbedding


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        # x [N, H]; kv_cache [2, num_blocks, block_size, heads, head_dim]
        meta = get_forward_context()
        shape = (x.shape[0], self.num_heads, self.head_dim)
        q = self.q_proj(x).view(shape)
        k = self.k_proj(x).view(shape)
        v = self.v_proj(x).view(shape)
        q, k = rotary(positions, q, k)
        store_kvcache(k, v, kv_cache[0], kv_cache[1], meta.slot_mapping)
        out = paged_attention(q, kv_cache[0], kv_cache[1], meta)  # [N, heads, head_dim]
        return self.o_proj(out.flatten(1))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        # Self attention
        residual = x
        x = self.self_attn(self.input_layernorm(x), positions, rotary, kv_cache)
        x = residual + x
        # MLP
        residual = x
        x = self.mlp(self.post_attention_layernorm(x))
        return residual + x


class ChatTTSLlama(nn.Module):
    """HF-LlamaModel-compatible decoder stack over packed varlen rows."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta)

    def forward(
        self, inputs_embeds: torch.Tensor, positions: torch.Tensor, kv_caches: Sequence[torch.Tensor] | torch.Tensor
    ) -> torch.Tensor:
        """inputs_embeds [N_new, H], positions [N_new] -> hidden [N_new, H] after the final norm.

        kv_caches[i] is layer i's [2, num_blocks, block_size, heads, head_dim] pool (a list, or the
        [num_layers, ...] tensor from allocate_kv_cache). Must run inside forward_context(meta).
        """
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"kv_caches: need one pool per layer ({len(self.layers)}), got {len(kv_caches)}")
        x = inputs_embeds
        for layer, kv_cache in zip(self.layers, kv_caches):
            x = layer(x, positions, self.rotary_emb, kv_cache)
        return self.norm(x)
