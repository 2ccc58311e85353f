"""The GPT backbone with a paged KV cache: embeddings of the new positions in, final-norm hidden states out.

Parameter names equal the keys of asset/gpt/model.safetensors (HF `LlamaModel` without `embed_tokens`).
Every forward takes the step's metadata; see attention.py for the KV pool layout. `pack_linears` adds fused,
kernel-specific copies of the projections (bf16 oneDNN / tiles, int8) for fast engines; `use_decode_attention`
sets, once, the attention of decode steps given DecodeMetadata (the engine's decode backend chooses it).
fused.py runs a whole decode-step layer as one C++ op over the packed weights.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import torch
from torch import nn

from chattts_velocity.config import ModelConfig
from chattts_velocity.model.attention import (
    AttentionMetadata,
    DecodeMetadata,
    kv_compute_dtype,
    paged_attention,
    paged_decode_attention,
    store_kvcache,
)
from chattts_velocity.model.layers import LlamaMLP, RMSNorm, RotaryEmbedding, linear
from chattts_velocity.model.packed import PackedLinear, fuse_rows

StepMetadata = AttentionMetadata | DecodeMetadata
KVPair = tuple[torch.Tensor, torch.Tensor]  # one layer's K and V pools
# q [B, heads, head_dim], K and V pools, DecodeMetadata -> [B, heads, head_dim]
DecodeAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, DecodeMetadata], torch.Tensor]


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
        self.qkv_packed: PackedLinear | None = None  # fused q/k/v rows; set by ChatTTSLlama.pack_linears
        self.o_packed: PackedLinear | None = None
        self.decode_attention: DecodeAttention = paged_decode_attention  # set by ChatTTSLlama.use_decode_attention
        self.batch_invariant = False  # set by ChatTTSLlama.use_batch_invariant_ops

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # x [N, H] -> q, k, v, each [N, H] (through the packed linears when set)
        if self.qkv_packed is None:
            tiled = self.batch_invariant
            return linear(self.q_proj, x, tiled), linear(self.k_proj, x, tiled), linear(self.v_proj, x, tiled)
        q, k, v = self.qkv_packed(x).split(x.shape[-1], dim=-1)  # [N, 3H] -> 3 x [N, H]
        return q, k, v

    def project_out(self, out: torch.Tensor) -> torch.Tensor:
        # out [N, heads * head_dim] -> [N, H]
        projected = linear(self.o_proj, out, self.batch_invariant) if self.o_packed is None else self.o_packed(out)
        return projected

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding, kv_cache: KVPair,
        meta: StepMetadata,
    ) -> torch.Tensor:
        # x [N, H]; kv_cache: (K, V) pools, each [num_blocks, block_size, heads, head_dim] (+ 4 for int8)
        shape = (x.shape[0], self.num_heads, self.head_dim)
        q, k, v = (t.view(shape) for t in self.project_qkv(x))
        q, k = rotary(positions, q.float(), k.float())  # RoPE in fp32 whatever the weights' dtype
        k_cache, v_cache = kv_cache
        store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping)
        q = q.to(kv_compute_dtype(k_cache))
        if isinstance(meta, DecodeMetadata):
            out = self.decode_attention(q, k_cache, v_cache, meta)  # [N, heads, head_dim]
        else:
            out = paged_attention(q, k_cache, v_cache, meta, per_sequence=self.batch_invariant)
        return self.project_out(out.flatten(1))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config)
        self.mlp = LlamaMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding, kv_cache: KVPair,
        meta: StepMetadata,
    ) -> torch.Tensor:
        # Self attention
        residual = x
        x = self.self_attn(self.input_layernorm(x), positions, rotary, kv_cache, meta)
        x = residual + x
        # MLP
        residual = x
        x = self.mlp(self.post_attention_layernorm(x))
        return residual + x


def run_decoder_layer(
    layer: LlamaDecoderLayer, x: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding,
    kv_cache: KVPair, meta: StepMetadata,
) -> torch.Tensor:
    hidden: torch.Tensor = layer(x, positions, rotary, kv_cache, meta)
    return hidden


class ChatTTSLlama(nn.Module):
    """HF-LlamaModel-compatible decoder stack over packed varlen rows."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # a ModuleList (its layers are submodules, keys layers.i.*), typed by what it holds
        self.layers = cast(Sequence[LlamaDecoderLayer],
                           nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers)))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[KVPair],
        meta: StepMetadata,
        run_layer: Callable[..., torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """inputs_embeds [N_new, H], positions [N_new] -> hidden [N_new, H] after the final norm.

        kv_caches[i] is layer i's (K, V) pools (allocate_kv_pairs); meta is the step's AttentionMetadata, or
        DecodeMetadata for a decode step (one new position per sequence). Activations keep the embeddings'
        dtype between layers. run_layer(layer, x, positions, rotary, kv_cache, meta) replaces the plain layer
        call (the compiled torch backend passes a torch.compile'd run_decoder_layer: one graph, all layers).
        """
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"kv_caches: need one pool per layer ({len(self.layers)}), got {len(kv_caches)}")
        run_layer = run_decoder_layer if run_layer is None else run_layer
        x = inputs_embeds
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = run_layer(layer, x, positions, self.rotary_emb, kv_cache, meta)
        hidden: torch.Tensor = self.norm(x)
        return hidden

    def use_decode_attention(self, attention: DecodeAttention) -> None:
        """Every layer attends with `attention` in steps given DecodeMetadata (default: paged_decode_attention)."""
        for layer in self.layers:
            layer.self_attn.decode_attention = attention

    def use_batch_invariant_ops(self) -> None:
        """Make a row's hidden state independent of the other rows of its step (the eager torch backend on CPU):
        unpacked projections run tiled_linear, and each sequence attends alone (paged_attention per_sequence)."""
        for layer in self.layers:
            layer.self_attn.batch_invariant = layer.mlp.tiled = True

    def pack_linears(self, mode: str) -> None:
        """Route every projection through a PackedLinear of `mode` (q/k/v and gate/up fused).

        The checkpoint's Linear modules (and so the state dict) are kept as they are.
        """
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.qkv_packed = PackedLinear(fuse_rows(attn.q_proj, attn.k_proj, attn.v_proj), mode)
            attn.o_packed = PackedLinear(attn.o_proj.weight, mode)
            mlp.gate_up_packed = PackedLinear(fuse_rows(mlp.gate_proj, mlp.up_proj), mode)
            mlp.down_packed = PackedLinear(mlp.down_proj.weight, mode)
