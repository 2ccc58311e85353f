"""Engine stage, CUDA backend: the paged Llama's layers through the Triton kernels of model/kernels/triton.

In: embeddings of the new positions (and, for decode steps, positions and block tables). Out: hidden [N, H] after
the final norm, as the torch backend gives them. Every step runs five kernels a layer (engine/worker/backends/
triton_layers.py) over q|k|v and gate|up weights packed once at load; decode steps attend with the batch-invariant
decode kernel, and so do the generated positions of general steps (a decode row beside a prefill chunk, positions
recomputed after preemption); prompt rows attend with the varlen prefill kernel. A row's bits therefore depend neither
on its batch-mates nor on the kind of step it ran in.
The KV pool is the engine's. On CUDA, decode steps replay CUDA graphs (backends/cuda_graphs.py), the kernels
chained by Programmatic Dependent Launch where the GPU and Triton have it; on CPU (TRITON_INTERPRET=1) they run
eagerly.

NOTE (sampling): an engine on this backend samples on the device too (worker/sampling/device_sampler.py, the backend's
sampler): Philox noise keyed by (seed, step), batch invariant, but a different random stream from the
other backends' CPU generator (same distribution, different audio per seed).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
from typing import Any

import numpy as np
import torch

from chattts_velocity.engine.worker.backends.cuda_graphs import DecodeGraphs, graph_batch_sizes
from chattts_velocity.engine.worker.backends.triton_layers import FusedLayers
from chattts_velocity.engine.worker.sampling.device_sampler import DeviceSampler
from chattts_velocity.engine.worker.step_inputs import PagedKV, StepTensors, to_device
from chattts_velocity.model import ChatTTSLlama, DecodeMetadata
from chattts_velocity.model.kernels.triton import available

logger = logging.getLogger("chattts_velocity")


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
            decode_attention,
            gemm,
            prefill_attention,
        )

        self.model, self.kv, self.sampler = model, kv, DeviceSampler()
        self.prefill_attention, self.decode_attention = prefill_attention, decode_attention
        self.pdl = gemm.pdl_available(kv.device)
        # the heads through a fixed-tile Triton GEMM on CUDA, where cuBLAS picks kernels by M (a graph's padded size
        # or the rows an eager step samples); BLAS on CPU is row-invariant already (Embed.logits_rowwise)
        config = model.config
        head_shapes = [(config.num_vq * config.num_audio_tokens, config.hidden_size),
                       (config.num_text_tokens, config.hidden_size)]
        self.layers = FusedLayers(model, kv, self.pdl, head_shapes)
        self.head_gemm = (functools.partial(gemm.linear, workspace=self.layers.workspace)
                          if kv.device.type == "cuda" else None)
        heads, head_dim = model.config.num_attention_heads, model.config.head_dim
        # one scratch for every layer's decode attention (kernels run in order), as large as a step can need
        self.workspace = decode_attention.Workspace.allocate(max_num_seqs, heads, max_model_len + kv.block_size,
                                                             head_dim, kv.device)
        self.graphs: DecodeGraphs | None = None
        with self.device_guard():
            self.warm_up(act_dtype)
            if kv.device.type == "cuda":
                self.capture_graphs(act_dtype, max_num_seqs, max_model_len)

    def capture_graphs(self, act_dtype: torch.dtype, max_num_seqs: int, max_model_len: int) -> None:
        """The decode graphs; if capturing the PDL launches fails, once more without PDL (plain stream order)."""
        width = -(-max_model_len // self.kv.block_size)
        self.graphs = DecodeGraphs(self.decode_step, self.kv, graph_batch_sizes(max_num_seqs), width,
                                   self.model.config.hidden_size, act_dtype)
        try:
            self.graphs.capture()
        except RuntimeError as exc:
            if not self.pdl:
                raise
            logger.warning("capturing the decode graphs with programmatic dependent launch failed (%s); "
                           "capturing without it", exc)
            self.pdl = self.layers.pdl = False
            self.capture_graphs(act_dtype, max_num_seqs, max_model_len)

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
        generated = self._generated_rows(step)

        def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.prefill_attention.paged_prefill_attention(
                q, k_cache, v_cache, cu_q_lens, k_lens, step.block_tables, max_q_len)
            if generated is not None:  # their prefill-kernel results are replaced by the decode kernel's
                rows, meta = generated
                out[rows] = self.decode_attention.paged_decode_attention(
                    q[rows], k_cache, v_cache, meta.block_tables, meta.context_lens, self.workspace, pdl=self.pdl,
                    max_context=max(step.k_lens))
            return out

        return self.layers(embeds, step.positions, step.slots, attend)

    def _generated_rows(self, step: StepTensors) -> tuple[torch.Tensor, DecodeMetadata] | None:
        """The rows of a general step at generated positions (a decode row beside prefill chunks, or positions
        recomputed after preemption): [G] row indices and their decode metadata, or None when there are none. They
        attend with the decode kernel, as in a decode step, so a row's bits do not depend on the kind of step it
        ran in (the seed contract); prompt rows keep the prefill kernel, whose rows do not depend on the chunk."""
        if step.prompt_lens is None:
            return None
        q_lens, k_lens = np.asarray(step.q_lens), np.asarray(step.k_lens)
        starts = np.cumsum(q_lens) - q_lens
        first = np.clip(np.asarray(step.prompt_lens) - (k_lens - q_lens), 0, q_lens)  # first generated row per seq
        counts = q_lens - first
        if not counts.any():
            return None
        offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        rows = to_device(torch.from_numpy(np.repeat(starts + first, counts) + offsets), self.kv.device)
        return rows, step.row_metadata(rows)

    def decode_step(self, embeds: torch.Tensor, positions: torch.Tensor, meta: DecodeMetadata,
                    out: torch.Tensor | None = None) -> torch.Tensor:
        """embeds [B, H], positions [B] -> hidden [B, H] (into out, if given, e.g. fp32): device tensors only, so a
        CUDA graph can capture it."""

        def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
            attended: torch.Tensor = self.decode_attention.paged_decode_attention(
                q, k_cache, v_cache, meta.block_tables, meta.context_lens, self.workspace, pdl=self.pdl)
            return attended

        return self.layers(embeds, positions, meta.slot_mapping, attend, out)
