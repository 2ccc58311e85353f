"""Engine stage, CUDA backend: the triton backend's layers, five kernels each, over weights packed once at load.

In: the residual stream x [N, H] (the embeddings), positions and pool slots [N], and the attention of the step
(decode or varlen prefill). Out: hidden [N, H] after the final norm. Per layer:

| kernel | does |
|---|---|
| K1 `qkv.norm_qkv_rope` | RMSNorm -> q|k|v (one packed weight) -> RoPE -> K/V into the pool |
| K2 `decode_attention.paged_decode_attention` or `prefill_attention.paged_prefill_attention` | paged attention |
| K3 `gemm.residual_linear` | o projection + the residual add |
| K4 `gemm.norm_gate_up` | RMSNorm -> gate|up (one packed weight) -> SiLU(gate) * up |
| K5 `gemm.residual_linear` | down projection + the residual add |

then one `norm.rms_norm` after the last layer. Every kernel is batch-invariant (a row's bits do not depend on
the other rows; gemm.py and decode_attention.py say why), so a seeded request samples the same codes alone and in
any batch. The packed q|k|v and gate|up weights replace the checkpoint Linears' storage (those become views of
them), so packing copies nothing that stays alive twice.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from chattts_velocity.engine.worker.step_inputs import PagedKV
from chattts_velocity.model import ChatTTSLlama

# q [N, heads, head_dim] (in the pool's dtype), the layer's K and V pools -> attention output [N, heads, head_dim]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class PackedLayer:
    """One decoder layer's weights as the fused kernels read them (the model's dtype, contiguous)."""

    input_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [(heads + 2 kv_heads) * head_dim, H]: q rows, then k, then v
    o: torch.Tensor  # [H, heads * head_dim]
    post_norm: torch.Tensor  # [H]
    gate_up: torch.Tensor  # [2 I, H]: gate rows, then up
    down: torch.Tensor  # [H, I]


def pack_rows(*linears: nn.Linear) -> torch.Tensor:
    """The Linears' weights stacked as one [sum(out), in] tensor; each Linear's weight becomes a view into it."""
    packed = torch.cat([linear.weight.detach() for linear in linears], dim=0).contiguous()
    start = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight.data = packed[start: start + rows]
        start += rows
    return packed


@torch.no_grad()
def pack_layers(model: ChatTTSLlama) -> list[PackedLayer]:
    layers = []
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        layers.append(PackedLayer(
            input_norm=layer.input_layernorm.weight.detach().contiguous(),
            qkv=pack_rows(attn.q_proj, attn.k_proj, attn.v_proj),
            o=attn.o_proj.weight.detach().contiguous(),
            post_norm=layer.post_attention_layernorm.weight.detach().contiguous(),
            gate_up=pack_rows(mlp.gate_proj, mlp.up_proj),
            down=mlp.down_proj.weight.detach().contiguous(),
        ))
    return layers


class FusedLayers:
    """The model's layers through the five kernels a layer (the module's table)."""

    def __init__(self, model: ChatTTSLlama, kv: PagedKV, pdl: bool, head_shapes: list[tuple[int, int]]) -> None:
        """head_shapes: the heads' [N, K] the step's fp32 head GEMM runs over (they share the split-K scratch)."""
        from chattts_velocity.model.kernels.triton import (  # imports triton: only when the backend is chosen
            gemm,
            norm,
            qkv,
            split_k,
        )

        self.gemm, self.norm, self.qkv = gemm, norm, qkv
        self.layers, self.kv, self.pdl = pack_layers(model), kv, pdl
        # one split-K scratch for every GEMM of a step (they run in order)
        gemms = self._split_shapes(self.layers[0]) + [(n, n, k, gemm.FP32_TILE.blocks) for n, k in head_shapes]
        self.workspace = split_k.workspace_for_gemms(gemms, split_k.WORKSPACE_ROWS, kv.device)
        self.final_norm = model.norm.weight.detach().contiguous()
        self.cos, self.sin = model.rotary_emb.cos_cache, model.rotary_emb.sin_cache
        self.eps = model.config.rms_norm_eps

    def _split_shapes(self, packed: PackedLayer) -> list[tuple[int, int, int, tuple[int, int, int]]]:
        """Each layer GEMM's (columns, partial width, K, block) as split_k.launch_split takes them."""
        def block(weight: torch.Tensor) -> tuple[int, int, int]:
            blocks: tuple[int, int, int] = self.gemm.tile_for(weight).blocks
            return blocks

        (qkv_rows, hidden), (inter2, _), (out_rows, inter) = packed.qkv.shape, packed.gate_up.shape, packed.down.shape
        return [(qkv_rows // 2, qkv_rows, hidden, block(packed.qkv)),
                (packed.o.shape[0], packed.o.shape[0], packed.o.shape[1], block(packed.o)),
                (inter2 // 2, inter2, hidden, block(packed.gate_up)),
                (out_rows, out_rows, inter, block(packed.down))]

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, attend: Attend,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """x [N, H] -> hidden [N, H]: 5 launches a layer, then the final norm (into out [N, H], fp32 or the
        activations' dtype, if given)."""
        gemm, pdl, eps, space = self.gemm, self.pdl, self.eps, self.workspace
        residual = x.contiguous()
        # the residual stream's row statistics, written by o and down, read by the next norm (gemm.py's note);
        # None: the first layer's norm sums its input itself
        stats: torch.Tensor | None = None
        for packed, (k_cache, v_cache) in zip(self.layers, self.kv.pairs, strict=True):
            q = self.qkv.norm_qkv_rope(residual, packed.input_norm, packed.qkv, positions, slots, self.cos, self.sin,
                                       k_cache, v_cache, eps, pdl=pdl, workspace=space, stats=stats)
            attended = attend(q, k_cache, v_cache)  # [N, heads, head_dim]
            if stats is None:
                stats = gemm.stats_buffer(residual.shape[0], packed.o)
            residual = gemm.residual_linear(attended.flatten(1), packed.o, residual, pdl=pdl, workspace=space,
                                            stats=stats)
            act = gemm.norm_gate_up(residual, packed.post_norm, packed.gate_up, eps, pdl=pdl, workspace=space,
                                    stats=stats)
            residual = gemm.residual_linear(act, packed.down, residual, pdl=pdl, workspace=space, stats=stats)
        hidden: torch.Tensor = self.norm.rms_norm(residual, self.final_norm, eps, out=out)
        return hidden
