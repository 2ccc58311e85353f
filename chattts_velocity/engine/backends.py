"""Engine stage: the decode backends — what runs the paged Llama for a step, chosen once per engine.

In: embeddings of the new positions [N, H] and the step's integer inputs (StepTensors: positions, slots, block
tables, built once per step by the model runner). Out: hidden states [N, H] after the final norm. Each backend
derives from them the metadata its own kernels read (only the torch backends build an attention mask), and owns
its sampler. The scheduler, block manager and sequences never see which backend runs; the model runner calls `run`.

| backend | a decode step | general steps |
|---|---|---|
| TorchBackend ("torch") | eager layers, SDPA over gathered blocks | eager layers |
| CompiledTorchBackend ("torch.compile") | one torch.compile'd layer graph (C++ attention on bf16 pools) | eager |
| CpuBackend ("cpu") | one fused C++ op per layer (model/fused.py) | the same op, a row per position |
| TritonBackend ("triton", engine/triton_backend.py) | Triton kernels per layer, CUDA graphs on CUDA | Triton kernels |
"""
from __future__ import annotations

import logging
import time
from typing import Protocol

import torch

from chattts_velocity.config import EngineConfig
from chattts_velocity.engine.paged_kv import ListInputs, PagedKV, StepTensors, padded_decode
from chattts_velocity.engine.sampler import Sampler
from chattts_velocity.model import (
    AttentionMetadata,
    ChatTTSLlama,
    FusedDecoder,
    build_attention_metadata,
    fused_unavailable,
    kernel_decode_attention,
    kernels,
)
from chattts_velocity.model.llama import run_decoder_layer
from chattts_velocity.precision import Precision

logger = logging.getLogger("chattts_velocity")
MIN_DYNAMIC = 2  # compiled steps pad batch and table width to >= 2: torch.compile specialises sizes 0 and 1


class DecodeBackend(Protocol):
    @property
    def name(self) -> str:
        """"torch", "torch.compile", "cpu" or "triton": reported in LLMEngine.metrics()."""

    @property
    def sampler(self) -> Sampler:
        """The one sampler of the engine (the triton backend's samples on the device)."""

    def run(self, embeds: torch.Tensor, step: StepTensors) -> torch.Tensor:
        """One step (decode, prefill chunks, recompute, mixed): embeds [N, H] -> hidden [N, H]."""


def attention_metadata(step: StepTensors, kv: PagedKV) -> AttentionMetadata:
    """The torch layers' metadata (gather indices and, where contexts differ, the attention mask)."""
    return build_attention_metadata(step.q_lens, step.k_lens, step.block_tables, kv.block_size, kv.device)


class TorchBackend(ListInputs):
    """Eager torch everywhere: a decode step is a general step of one position per sequence (paged_attention)."""

    name = "torch"

    def __init__(self, model: ChatTTSLlama, kv: PagedKV) -> None:
        self.model, self.kv, self.sampler = model, kv, Sampler()

    def run(self, embeds: torch.Tensor, step: StepTensors) -> torch.Tensor:
        meta = attention_metadata(step, self.kv)
        hidden: torch.Tensor = self.model(embeds, meta.positions, self.kv.pairs, meta)
        return hidden


class CompiledTorchBackend(ListInputs):
    """Decode steps run one torch.compile'd layer graph for all layers (their weights are graph inputs, not
    constants) whose only dynamic sizes are the batch and the block-table width: no recompiles once warmed up.
    Attention inside the graph is the C++ kernel on bf16 pools where the kernels build, else the gather form."""

    name = "torch.compile"

    def __init__(self, model: ChatTTSLlama, kv: PagedKV, act_dtype: torch.dtype) -> None:
        self.model, self.kv, self.act_dtype, self.sampler = model, kv, act_dtype, Sampler()
        kv_dtype, head_dim = kv.pairs[0][0].dtype, model.config.head_dim
        if kv.device.type == "cpu" and kv_dtype == torch.bfloat16 and head_dim % 32 == 0 and kernels.load():
            model.use_decode_attention(kernel_decode_attention)
        self.layer = torch.compile(run_decoder_layer, fullgraph=True, dynamic=False,
                                   options={"cpp.simdlen": kernels.inductor_simdlen()})
        self._warm_up()

    def run(self, embeds: torch.Tensor, step: StepTensors) -> torch.Tensor:
        if not step.decode_only:
            meta = attention_metadata(step, self.kv)
            hidden: torch.Tensor = self.model(embeds, meta.positions, self.kv.pairs, meta)
            return hidden
        return self._decode(embeds, step)[: step.num_seqs]

    def _decode(self, embeds: torch.Tensor, step: StepTensors) -> torch.Tensor:
        size, width = max(MIN_DYNAMIC, step.num_seqs), max(MIN_DYNAMIC, step.block_tables.shape[1])
        pos, meta = padded_decode(step, self.kv, size, width)
        num_pad = pos.shape[0] - embeds.shape[0]
        if num_pad:
            embeds = torch.cat([embeds, embeds.new_zeros(num_pad, embeds.shape[1])])
        for t in (embeds, pos, *meta):
            torch._dynamo.mark_dynamic(t, 0)
        torch._dynamo.mark_dynamic(meta.block_tables, 1)
        hidden: torch.Tensor = self.model(embeds, pos, self.kv.pairs, meta, run_layer=self.layer)  # [B_pad, H]
        return hidden

    @torch.inference_mode()
    def _warm_up(self) -> None:
        """Compile now, on the padding block only: batch 2, table width 3 (distinct sizes, so the
        two dynamic dimensions get separate symbols)."""
        start = time.perf_counter()
        embeds = torch.zeros(MIN_DYNAMIC, self.model.config.hidden_size, dtype=self.act_dtype, device=self.kv.device)
        step = StepTensors.from_lists([1] * MIN_DYNAMIC, [1] * MIN_DYNAMIC, [[self.kv.pad_block] * 3] * MIN_DYNAMIC,
                                      self.kv.block_size, self.kv.device)
        self._decode(embeds, step)
        for pool in (t for pair in self.kv.pairs for t in pair):
            pool[self.kv.pad_block].zero_()
        logger.info("compiled the decode step in %.1f s", time.perf_counter() - start)


class CpuBackend(ListInputs):
    """Every step runs one fused C++ op per layer (bf16 and int8 engines on CPUs where the kernels build); nothing
    is compiled. A general step's rows go through the op as rows of their own positions, so a position gets the
    same bits in a prefill chunk, a decode step or a recompute after preemption, in any batch (the seed contract).
    """

    name = "cpu"

    def __init__(self, model: ChatTTSLlama, kv: PagedKV) -> None:
        self.model, self.kv, self.sampler = model, kv, Sampler()
        self.fused = FusedDecoder(model)

    def run(self, embeds: torch.Tensor, step: StepTensors) -> torch.Tensor:
        # a general step's rows are decode rows of their own positions (each with its sequence's table)
        return self.fused(embeds, step.positions, self.kv.pairs, step.row_metadata())


def cpu_unavailable(model: ChatTTSLlama, precision: Precision) -> str | None:
    """Why the cpu backend cannot run this engine, or None when it can."""
    if precision.kv_cache not in (torch.bfloat16, torch.int8):
        return (f"its fused C++ layers need a bfloat16 KV cache (dtype 'bfloat16' or 'int8') or an int8 one "
                f"(kv_cache_dtype 'int8'), this one is {precision.kv_cache}")
    return fused_unavailable(model)


def select_backend(config: EngineConfig, model: ChatTTSLlama, kv: PagedKV) -> DecodeBackend:
    """The backend config.backend asks for. "auto": triton on CUDA devices where it can run, else cpu where it can
    run, else torch (compiled if config.compile).

    NOTE: one branch per backend, no registry. Asking for a backend that cannot run is a ValueError saying why,
    never a silent fallback; "auto" on CUDA falls back to torch with one warning when the triton backend fails at
    load (a kernel compile or the CUDA graph capture). The triton module is imported only when it is chosen
    (importing it imports triton).
    """
    choice, act_dtype = config.backend, config.precision.activations
    if choice == "triton" or (choice == "auto" and kv.device.type == "cuda"):
        from chattts_velocity.engine.triton_backend import (
            TritonBackend,
            triton_unavailable,
        )

        reason = triton_unavailable(kv)
        if reason is None:
            try:
                return TritonBackend(model, kv, act_dtype, config.max_num_seqs, config.max_model_len)
            except Exception as exc:  # noqa: BLE001 -- a compile or capture failure at load: "auto" serves anyway
                if choice == "triton":
                    raise
                reason = f"its warm-up or CUDA graph capture failed ({type(exc).__name__}: {exc})"
                logger.warning("backend 'auto': the triton backend cannot run here: %s; using the torch backend",
                               reason)
        if choice == "triton":
            raise ValueError(f"backend: 'triton' cannot run here: {reason}; use backend='torch' or 'auto'")
    if choice in ("auto", "cpu"):
        reason = cpu_unavailable(model, config.precision)
        if reason is None:
            if config.compile:
                logger.info("decode steps run fused C++ layers: nothing to compile")
            return CpuBackend(model, kv)
        if choice == "cpu":
            raise ValueError(f"backend: 'cpu' cannot run here: {reason}; use backend='torch' or 'auto'")
        if config.precision.kv_cache == torch.int8:  # no other backend reads int8 pools
            raise ValueError(f"kv_cache_dtype: 'int8' needs the cpu backend, which cannot run here: {reason}")
    if config.compile:
        return CompiledTorchBackend(model, kv, act_dtype)
    return TorchBackend(model, kv)
