"""The GPT backbone with a paged KV cache: embeddings of the new positions in, final-norm hidden states out.

Parameter names equal the keys of asset/gpt/model.safetensors (HF `LlamaModel` without `embed_tokens`).
The step's metadata is an argument or comes from `forward_context`; see attention.py for the KV pool layout.
`pack_linears` adds fused, kernel-specific copies of the projections (bf16 oneDNN, int8) for fast engines, and
where the C++ kernels build, `decode` runs a whole decode-step layer as one op (kernels/cpu_decode_layer.cpp).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from chattts_velocity.config import ModelConfig
from chattts_velocity.model import kernels
from chattts_velocity.model.attention import (
    AttentionMetadata,
    DecodeMetadata,
    get_forward_context,
    paged_attention,
    paged_decode_attention,
    store_kvcache,
)
from chattts_velocity.model.layers import LlamaMLP, RMSNorm, RotaryEmbedding
from chattts_velocity.model.packed import TILES_BELOW_ROWS, PackedLinear, fuse_rows

StepMetadata = AttentionMetadata | DecodeMetadata
KVPair = tuple[torch.Tensor, torch.Tensor]  # one layer's K and V pools


@dataclass
class FusedLayerWeights:
    """One layer's weights as kernels/cpu_decode_layer.cpp takes them."""

    norms: torch.Tensor  # [2, H] fp32: input_layernorm, post_attention_layernorm
    weights: list[torch.Tensor]  # tiles of the qkv, o, gate_up and down projections (all bf16 or all int8)
    panels: list[torch.Tensor | None]  # per projection: the AMX layout, on CPUs with AMX
    extras: list[torch.Tensor | None]  # per projection: oneDNN's packed bf16 copy (or None), or int8 scales

    @classmethod
    def of(cls, layer: LlamaDecoderLayer) -> FusedLayerWeights | None:
        """None unless every projection of the layer has tiles (see PackedLinear)."""
        attn, mlp = layer.self_attn, layer.mlp
        packed = [attn.qkv_packed, attn.o_packed, mlp.gate_up_packed, mlp.down_packed]
        if any(p is None or p.tiles is None for p in packed):
            return None
        norms = torch.stack([layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach()])
        extras = [p.scales if p.mode == "int8" else p.onednn for p in packed]
        return cls(norms.float().contiguous(), [p.tiles for p in packed], [p.panels for p in packed], extras)


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
        self.decode_kernel = False  # kernels' paged_decode_attention for bf16 caches; set by pack_linears

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.qkv_packed is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self.qkv_packed(x).split(x.shape[-1], dim=-1)  # [N, 3H] -> 3 x [N, H]

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, rotary: RotaryEmbedding, kv_cache: KVPair,
        meta: StepMetadata,
    ) -> torch.Tensor:
        # x [N, H]; kv_cache: (K, V) pools, each [num_blocks, block_size, heads, head_dim]
        shape = (x.shape[0], self.num_heads, self.head_dim)
        q, k, v = (t.view(shape) for t in self._qkv(x))
        q, k = rotary(positions, q.float(), k.float())  # RoPE in fp32 whatever the weights' dtype
        k_cache, v_cache = kv_cache
        store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping)
        q = q.to(k_cache.dtype)
        if isinstance(meta, DecodeMetadata) and self.decode_kernel and k_cache.dtype == torch.bfloat16:
            out = torch.ops.chattts_velocity_cpu.paged_decode_attention(
                q, k_cache, v_cache, meta.block_tables, meta.context_lens, self.head_dim**-0.5)
        elif isinstance(meta, DecodeMetadata):
            out = paged_decode_attention(q, k_cache, v_cache, meta)  # [N, heads, head_dim]
        else:
            out = paged_attention(q, k_cache, v_cache, meta)
        out = out.flatten(1)
        return self.o_proj(out) if self.o_packed is None else self.o_packed(out)


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
    return layer(x, positions, rotary, kv_cache, meta)


class ChatTTSLlama(nn.Module):
    """HF-LlamaModel-compatible decoder stack over packed varlen rows."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta)
        self.fused_layers: list[FusedLayerWeights] | None = None  # set by pack_linears where the kernels build

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[torch.Tensor | KVPair] | torch.Tensor,
        meta: StepMetadata | None = None,
        run_layer: Callable[..., torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """inputs_embeds [N_new, H], positions [N_new] -> hidden [N_new, H] after the final norm.

        kv_caches[i] is layer i's K and V pools: a [2, num_blocks, block_size, heads, head_dim] tensor
        (allocate_kv_cache) or a (K, V) pair (allocate_kv_pairs). The step's metadata is `meta`, or else
        the one set by forward_context(meta). Activations keep the embeddings' dtype between layers.
        run_layer(layer, x, positions, rotary, kv_cache, meta) replaces the plain layer call (the
        engine passes a torch.compile'd run_decoder_layer: one graph serves all layers).
        """
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"kv_caches: need one pool per layer ({len(self.layers)}), got {len(kv_caches)}")
        meta = get_forward_context() if meta is None else meta
        run_layer = run_decoder_layer if run_layer is None else run_layer
        x = inputs_embeds
        for layer, kv_cache in zip(self.layers, kv_caches):
            # K and V enter as two tensors; with allocate_kv_pairs they share no storage, and a
            # compiled layer writes them in place (two mutated views of one storage make
            # torch.compile copy the whole pool at every call)
            x = run_layer(layer, x, positions, self.rotary_emb, (kv_cache[0], kv_cache[1]), meta)
        return self.norm(x)

    def decode(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, kv_caches: Sequence[KVPair],
               meta: DecodeMetadata) -> torch.Tensor:
        """A decode step through the fused C++ layer (needs `fused_layers`): inputs_embeds [B, H] -> hidden [B, H].

        Same inputs as forward with one new position per sequence; kv_caches are (K, V) pairs of bf16 pools.
        """
        if self.fused_layers is None:
            raise ValueError("decode: the fused layer needs pack_linears('bfloat16' or 'int8') and the CPU kernels")
        op = torch.ops.chattts_velocity_cpu.decode_layer
        cos, sin = self.rotary_emb.cos_cache, self.rotary_emb.sin_cache
        eps = self.config.rms_norm_eps
        x = inputs_embeds.float().contiguous()
        for fused, (k_cache, v_cache) in zip(self.fused_layers, kv_caches):
            x = op(x, positions, cos, sin, fused.norms, fused.weights, fused.panels, fused.extras, k_cache, v_cache,
                   meta.slot_mapping, meta.block_tables, meta.context_lens, eps, TILES_BELOW_ROWS)
        return self.norm(x)

    def pack_linears(self, mode: str) -> None:
        """Route every projection through a PackedLinear of `mode` (q/k/v and gate/up fused).

        The checkpoint's Linear modules (and so the state dict) are kept as they are. Reduced-precision modes
        also switch compiled decode steps to the C++ paged attention where model/kernels builds, and give
        `decode` its fused layers when every projection has tiles.
        """
        decode_kernel = mode in ("bfloat16", "int8") and self.config.head_dim % 32 == 0 and kernels.load()
        for layer in self.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.qkv_packed = PackedLinear(fuse_rows(attn.q_proj, attn.k_proj, attn.v_proj), mode)
            attn.o_packed = PackedLinear(attn.o_proj.weight, mode)
            mlp.gate_up_packed = PackedLinear(fuse_rows(mlp.gate_proj, mlp.up_proj), mode)
            mlp.down_packed = PackedLinear(mlp.down_proj.weight, mode)
            attn.decode_kernel = decode_kernel
        fused = [FusedLayerWeights.of(layer) for layer in self.layers] if decode_kernel else []
        self.fused_layers = fused if fused and all(f is not None for f in fused) else None
