"""Engine backends "torch" (eager) and "torch.compile" (one compiled layer graph for decode steps)."""
from __future__ import annotations

import logging
import time

import torch

from chattts_velocity.engine.worker.sampling.sampler import Sampler
from chattts_velocity.engine.worker.step_inputs import PagedKV, StepTensors, padded_decode
from chattts_velocity.model import (
    AttentionMetadata,
    ChatTTSLlama,
    build_attention_metadata,
    kernel_decode_attention,
    kernels,
)
from chattts_velocity.model.llama import run_decoder_layer

logger = logging.getLogger("chattts_velocity")
MIN_DYNAMIC = 2  # compiled steps pad batch and table width to >= 2: torch.compile specialises sizes 0 and 1


def attention_metadata(step: StepTensors, kv: PagedKV) -> AttentionMetadata:
    """The torch layers' metadata (gather indices and, where contexts differ, the attention mask)."""
    return build_attention_metadata(step.q_lens, step.k_lens, step.block_tables, kv.block_size, kv.device,
                                    step.prompt_lens)


class TorchBackend:
    """Eager torch everywhere: a decode step is a general step of one position per sequence (paged_attention).
    On CPU the model runs batch-invariant ops (ChatTTSLlama.use_batch_invariant_ops): a seeded request's hidden
    states are the same bits alone and in any batch."""

    name = "torch"

    def __init__(self, model: ChatTTSLlama, kv: PagedKV) -> None:
        self.model, self.kv, self.sampler = model, kv, Sampler()
        if kv.device.type == "cpu":
            model.use_batch_invariant_ops()

    def run(self, embeds: torch.Tensor, step: StepTensors) -> torch.Tensor:
        meta = attention_metadata(step, self.kv)
        hidden: torch.Tensor = self.model(embeds, meta.positions, self.kv.pairs, meta)
        return hidden


class CompiledTorchBackend:
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


