"""Engine stage, CUDA backend: the paged Llama's layers through the Triton kernels of model/kernels/triton.

In: embeddings of the new positions (and, for decode steps, positions and block tables). Out: hidden [N, H] after
the final norm, as the torch backend gives them. Per layer: (fused add +) RMSNorm, the q/k/v projection, RoPE, the
KV store, paged attention (the decode kernel in decode steps, the varlen prefill kernel in general steps: prefill
chunks, recompute after preemption, mixed), the output projection, fused add + RMSNorm and the MLP. The linears
stay the model's own modules (cuBLAS on GPU): no weight is copied, and the KV pool is the engine's.
On CUDA, decode steps replay CUDA graphs (engine/backends/cuda_graphs.py); on CPU (TRITON_INTERPRET=1) they run eagerly.

NOTE (sampling): an engine on this backend samples on the device too (engine/sampling/device_sampler.py, the backend's
sampler): Philox noise keyed by (seed, step), batch invariant, but a different random stream from the
other backends' CPU generator (same distribution, different audio per seed).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

import torch

from chattts_velocity.engine.backends.cuda_graphs import DecodeGraphs, graph_batch_sizes
from chattts_velocity.engine.backends.paged_kv import PagedKV, StepTensors, to_device
from chattts_velocity.engine.sampling.device_sampler import DeviceSampler
from chattts_velocity.model import ChatTTSLlama, DecodeMetadata
from chattts_velocity.model.kernels.triton import available
from chattts_velocity.model.layers import RMSNorm
from chattts_velocity.model.llama import LlamaAttention

# q [N, heads, head_dim] (in the pool's dtype), the layer's K and V pools -> attention output [N, heads, head_dim]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def triton_unavailable(kv: PagedKV) -> str | None:
    """Why the triton backend cannot run on this engine's device, or None when it can."""
    reason = available()
    if reason is None and kv.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        reason = "the engine runs on CPU and TRITON_INTERPRET is not 1 (Triton's CPU interpreter); use device='cuda'"
    if reason is None and kv.device.type not in ("cpu", "cuda"):
        reason = f"Triton kernels run on CUDA devices, not {kv.device.type}"
    return reason


class TritonBackend:
    """Every step runs the layers with the Triton kernels; decode steps replay CUDA graphs on CUDA; the sampler
    runs on the device."""

    name = "triton"

    def __init__(self, model: ChatTTSLlama, kv: PagedKV, act_dtype: torch.dtype, max_num_seqs: int,
                 max_model_len: int) -> None:
        from chattts_velocity.model.kernels.triton import (  # imports triton: only when chosen
            attention,
            norm_rope,
        )

        self.model, self.kv, self.sampler = model, kv, DeviceSampler()
        self.attention, self.norm_rope = attention, norm_rope
        self.eps = model.config.rms_norm_eps
        self.graphs: DecodeGraphs | None = None
        with self.device_guard():
            self.warm_up(act_dtype)
            if kv.device.type == "cuda":
                width = -(-max_model_len // kv.block_size)
                self.graphs = DecodeGraphs(self.decode_step, kv, graph_batch_sizes(max_num_seqs), width,
                                           model.config.hidden_size, act_dtype)
                self.graphs.capture()

    def device_guard(self) -> contextlib.AbstractContextManager[Any]:
        """Launches and captures on the pool's device (device='cuda:1' must not run on the current device)."""
        return torch.cuda.device(self.kv.device) if self.kv.device.type == "cuda" else contextlib.nullcontext()

    @torch.inference_mode()
    def warm_up(self, act_dtype: torch.dtype) -> None:
        """Launch every kernel variant a step can need once, on the pad block only, so that no request waits for
        a JIT compile: a one-row prefill, an eager decode step, the sampler in code and text mode. (The CUDA
        graphs' capture then compiles the decode variants of each graph size.)"""
        config, kv = self.model.config, self.kv
        embeds = torch.zeros(1, config.hidden_size, dtype=act_dtype, device=kv.device)
        for q_len in (2, 1):  # a general step, then a decode step
            step = StepTensors.from_lists([q_len], [q_len], [[kv.pad_block]], kv.block_size, kv.device)
            self.run(embeds.expand(q_len, -1).contiguous(), step)
        self.sampler.warm_up(config.num_vq, config.num_audio_tokens, config.num_text_tokens, kv.device)
        for pool in (t for pair in kv.pairs for t in pair):
            pool[kv.pad_block].zero_()

    def run(self, embeds: torch.Tensor, step: StepTensors) -> torch.Tensor:
        with self.device_guard():
            return self._run(embeds, step)

    def _run(self, embeds: torch.Tensor, step: StepTensors) -> torch.Tensor:
        if step.decode_only:
            if self.graphs is not None and self.graphs.covers(step.num_seqs):
                return self.graphs.run(embeds, step)
            return self.decode_step(embeds, step.positions, step.row_metadata())
        # one copy for both: cu_q_lens [B + 1] and k_lens [B], each row starting 16-byte aligned (Triton
        # specialises pointers on that alignment: an offset that varies with B would compile a variant per parity)
        num, width = step.num_seqs, -(-(step.num_seqs + 1) // 4) * 4
        lens = torch.zeros(2, width, dtype=torch.int32)
        lens[0, 1: num + 1] = torch.tensor(step.q_lens, dtype=torch.int32).cumsum(0)
        lens[1, :num] = torch.tensor(step.k_lens, dtype=torch.int32)
        lens = to_device(lens, self.kv.device)
        cu_q_lens, k_lens, max_q_len = lens[0, : num + 1], lens[1, :num], max(step.q_lens)

        def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.attention.paged_prefill_attention(q, k_cache, v_cache, cu_q_lens, k_lens,
                                                                       step.block_tables, max_q_len)
            return out

        return self._layers(embeds, step.positions, step.slots, attend)

    def decode_step(self, embeds: torch.Tensor, positions: torch.Tensor, meta: DecodeMetadata) -> torch.Tensor:
        """embeds [B, H], positions [B] -> hidden [B, H]: device tensors only, so a CUDA graph can capture it."""

        def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.attention.paged_decode_attention(q, k_cache, v_cache, meta.block_tables,
                                                                      meta.context_lens)
            return out

        return self._layers(embeds, positions, meta.slot_mapping, attend)

    def _layers(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, attend: Attend) -> torch.Tensor:
        # x [N, H]. NOTE: the residual stream is added inside the next norm (fused_add_rms_norm): the same sums, in
        # the same dtype, as the torch layers' `residual + x`, so hidden states match theirs to rounding.
        norm = self.norm_rope
        residual = x
        hidden: torch.Tensor = norm.rms_norm(x, self.model.layers[0].input_layernorm.weight, self.eps)
        for i, (layer, kv_cache) in enumerate(zip(self.model.layers, self.kv.pairs, strict=True)):
            x = self._attention(layer.self_attn, hidden, positions, slots, kv_cache, attend)
            hidden, residual = self._add_norm(x, residual, layer.post_attention_layernorm)
            x = layer.mlp(hidden)
            next_norm = self.model.layers[i + 1].input_layernorm if i + 1 < len(self.model.layers) else self.model.norm
            hidden, residual = self._add_norm(x, residual, next_norm)
        return hidden

    def _add_norm(self, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        # (norm(residual + x), residual + x) in the wider dtype, as torch's `residual + x` promotes (bf16 linears
        # on fp32 activations, on CPU)
        dtype = torch.promote_types(x.dtype, residual.dtype)
        summed: tuple[torch.Tensor, torch.Tensor] = self.norm_rope.fused_add_rms_norm(
            x.to(dtype), residual.to(dtype), norm.weight, self.eps)
        return summed

    def _attention(self, attn: LlamaAttention, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                   kv_cache: tuple[torch.Tensor, torch.Tensor], attend: Attend) -> torch.Tensor:
        shape = (x.shape[0], attn.num_heads, attn.head_dim)
        q, k, v = (t.view(shape) for t in attn.project_qkv(x))
        rotary = self.model.rotary_emb
        # RoPE in fp32 whatever the weights' dtype, as model/llama.py
        q, k = self.norm_rope.apply_rope(q.float(), k.float(), positions, rotary.cos_cache, rotary.sin_cache)
        k_cache, v_cache = kv_cache
        self.attention.store_kv(k, v, k_cache, v_cache, slots)
        out = attend(q.to(k_cache.dtype), k_cache, v_cache)  # [N, heads, head_dim]
        return attn.project_out(out.flatten(1))
