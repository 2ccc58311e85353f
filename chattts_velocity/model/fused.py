"""Model stage: the GPT with every layer one C++ op (kernels/cpu_decode_layer.cpp: norms, RoPE, KV store,
attention, MLP) over the packed bf16, int8 or int4 weights, on the ISA whose library packed them.

In: inputs_embeds [B, H] (one row per position: a decode step's new positions, or a prefill chunk's), positions [B],
DecodeMetadata (a row's context_lens = its position + 1), (K, V) pools in bf16 or int8 (kv_cache_dtype).
Out: hidden [B, H] after the final norm, as ChatTTSLlama.forward would give.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from chattts_velocity.model import kernels
from chattts_velocity.model.attention import DecodeMetadata
from chattts_velocity.model.llama import ChatTTSLlama, KVPair, LlamaDecoderLayer


@dataclass
class FusedLayerWeights:
    """One layer's weights as kernels/cpu_decode_layer.cpp takes them."""

    norms: torch.Tensor  # [2, H] fp32: input_layernorm, post_attention_layernorm
    weights: list[torch.Tensor]  # the qkv, o, gate_up and down projections in kernel layout (one mode for all)
    scales: list[torch.Tensor | None]  # per projection: int8 / int4 scales, or None
    ops: Any  # torch.ops.<library> of the library that packed them: its ops are looked up by name
    int8_q8: bool  # int8 tiles times x's Q8 rows (PackedLinear.int8_q8)

    @classmethod
    def of(cls, layer: LlamaDecoderLayer) -> FusedLayerWeights | None:
        """None unless every projection of the layer is in our kernels' layout (see PackedLinear)."""
        attn, mlp = layer.self_attn, layer.mlp
        linears, weights = [], []
        for linear in (attn.qkv_packed, attn.o_packed, mlp.gate_up_packed, mlp.down_packed):
            if linear is None or linear.packed is None:
                return None
            linears.append(linear)
            weights.append(linear.packed)
        norms = torch.stack([layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach()])
        return cls(norms.float().contiguous(), weights, [p.scales for p in linears], linears[0].ops,
                   linears[0].int8_q8)


def fused_unavailable(model: ChatTTSLlama) -> str | None:
    """Why FusedDecoder cannot run `model` here, or None when it can."""
    device = next(model.parameters()).device
    if device.type != "cpu":
        return f"the model is on {device}; the fused layers run on CPU"
    reason = kernels.unsupported()
    if reason is not None:
        return f"the C++ kernels do not run here: {reason}"
    if not kernels.load():
        return "the C++ kernels failed to build (see the warning above)"
    if model.config.head_dim % 32:
        return f"head_dim {model.config.head_dim} is not a multiple of 32"
    if any(FusedLayerWeights.of(layer) is None for layer in model.layers):
        return "not every projection is in kernel layout (pack_linears('bfloat16', 'int8' or 'int4') first)"
    return None


class FusedDecoder:
    """ChatTTSLlama's decode step, one op per layer. Check fused_unavailable(model) before building one."""

    def __init__(self, model: ChatTTSLlama) -> None:
        reason = fused_unavailable(model)
        if reason is not None:
            raise ValueError(f"FusedDecoder: {reason}")
        self.model = model
        self.layers = [weights for layer in model.layers if (weights := FusedLayerWeights.of(layer)) is not None]

    def __call__(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, kv_caches: Sequence[KVPair],
                 meta: DecodeMetadata) -> torch.Tensor:
        """inputs_embeds [B, H], positions [B] -> hidden [B, H]; kv_caches are the layers' (K, V) pools."""
        rotary, eps = self.model.rotary_emb, self.model.config.rms_norm_eps
        cos, sin = rotary.cos_cache, rotary.sin_cache
        x = inputs_embeds.float().contiguous()
        for fused, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            x = fused.ops.decode_layer(x, positions, cos, sin, fused.norms, fused.weights, fused.scales, k_cache,
                                       v_cache, meta.slot_mapping, meta.block_tables, meta.context_lens, eps,
                                       fused.int8_q8)
        hidden: torch.Tensor = self.model.norm(x)
        return hidden
