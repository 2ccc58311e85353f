"""Engine stage: run one scheduled step — embed the new positions, run the paged Llama, sample.

In: ScheduledBatch (sequences, their new positions, block tables). Out: StepOutput (tokens [B, 4]
and the last-position hidden states [B, H] that predicted them).
"""
from __future__ import annotations

import logging
import time

import torch

from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.sampler import Sampler
from chattts_velocity.engine.scheduler import ScheduledBatch, StepOutput
from chattts_velocity.engine.sequence import Sequence
from chattts_velocity.model import (
    AttentionMetadata,
    ChatTTSLlama,
    DecodeMetadata,
    Embed,
    allocate_kv_pairs,
    build_attention_metadata,
)
from chattts_velocity.model.llama import run_decoder_layer

logger = logging.getLogger("chattts_velocity")
MIN_DYNAMIC = 2  # compiled steps pad batch and table width to >= 2: torch.compile specialises sizes 0 and 1


class ModelRunner:
    """Owns the KV pool, the model and the sampler; sees sequences only through ScheduledBatch.

    Decode-only steps (every sequence feeds its newest token) take a lean path: inputs are built
    from each sequence's last row and block table with a few list comprehensions and one tensor
    per field. In bf16 and int8 engines where the C++ kernels build, each layer of a decode step is one
    fused op (ChatTTSLlama.decode) and nothing is compiled. Otherwise, with compile=True, the decode layers
    run one torch.compile'd graph whose only dynamic sizes are the batch and the block-table width (no
    recompiles once warmed up).
    """

    def __init__(
        self, model: ChatTTSLlama, embed: Embed, config: ModelConfig, engine_config: EngineConfig, num_blocks: int,
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        self.model, self.embed, self.config = model.eval(), embed.eval(), config
        self.block_size = engine_config.block_size
        self.device = next(model.parameters()).device
        self.kv_dtype = kv_dtype or next(model.parameters()).dtype
        self.act_dtype = torch.float32 if self.device.type == "cpu" else self.kv_dtype
        # one block beyond the scheduler's pool: the write target of padding rows in compiled steps
        self.kv_cache = allocate_kv_pairs(
            config.num_hidden_layers, num_blocks + 1, self.block_size, config.num_attention_heads,
            config.head_dim, self.kv_dtype, self.device,
        )
        self.pad_block = num_blocks
        self.sampler = Sampler()
        self.compiled_layer = None
        self.fused_decode = model.fused_layers is not None and self.kv_dtype == torch.bfloat16
        if engine_config.compile and self.fused_decode:
            logger.info("decode steps run fused C++ layers: nothing to compile")
        elif engine_config.compile:
            # one graph serves all layers (their weights are graph inputs, not constants)
            self.compiled_layer = torch.compile(run_decoder_layer, fullgraph=True, dynamic=False)
            self._warm_up()

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepOutput:
        if batch.is_decode_only:
            last = self.run_decode(batch)  # [B, H]
        else:
            embeds, meta = self.prepare(batch)  # [N_new, H]
            hidden = self.model(embeds, meta.positions, self.kv_cache, meta)  # [N_new, H]
            last = hidden[meta.last_indices]  # [B, H], the states that predict this step's tokens
        last = last.float()
        tokens = self.sample(batch, last)  # [B, num_vq]
        return StepOutput(tokens=tokens, hidden=last, sampled=list(batch.sample))

    # ---- decode-only steps --------------------------------------------------------------------

    def run_decode(self, batch: ScheduledBatch) -> torch.Tensor:
        """hidden [B, H] of a step where each sequence feeds exactly its newest position."""
        seqs, positions = batch.seqs, batch.num_computed_tokens
        ids = torch.tensor([seq.last_row for seq in seqs], dtype=torch.int64)  # [B, num_vq]
        text = torch.tensor([seq.is_text for seq in seqs], dtype=torch.bool)  # [B]
        embeds = self.embed.embed(ids.to(self.device), text.to(self.device)).to(self.act_dtype)  # [B, H]
        bs = self.block_size
        tables = [seq.block_table[: p // bs + 1] for seq, p in zip(seqs, positions)]
        if self.fused_decode:
            pos, meta = self._decode_metadata(positions, tables)
            return self.model.decode(embeds, pos, self.kv_cache, meta)
        if self.compiled_layer is None:
            meta = build_attention_metadata([1] * len(seqs), [p + 1 for p in positions], tables, bs, self.device)
            return self.model(embeds, meta.positions, self.kv_cache, meta)
        return self._run_compiled(embeds, positions, tables)[: len(seqs)]

    def _decode_metadata(self, positions: list[int], tables: list[list[int]], min_size: int = 1,
                         ) -> tuple[torch.Tensor, DecodeMetadata]:
        """positions [B] and DecodeMetadata; batch and table width padded to min_size with padding-block rows."""
        bs, num_pad = self.block_size, max(0, min_size - len(positions))
        width = max(min_size, max(len(t) for t in tables))
        tables = [t + [0] * (width - len(t)) for t in tables] + [[self.pad_block] * width] * num_pad
        slots = [t[p // bs] * bs + p % bs for t, p in zip(tables, positions)] + [self.pad_block * bs] * num_pad
        as_tensor = lambda values: torch.tensor(values, dtype=torch.int64, device=self.device)
        pos = as_tensor(positions + [0] * num_pad)
        return pos, DecodeMetadata(as_tensor(slots), as_tensor(tables), pos + 1)

    def _run_compiled(self, embeds: torch.Tensor, positions: list[int], tables: list[list[int]]) -> torch.Tensor:
        pos, meta = self._decode_metadata(positions, tables, MIN_DYNAMIC)
        num_pad = pos.shape[0] - embeds.shape[0]
        if num_pad:
            embeds = torch.cat([embeds, embeds.new_zeros(num_pad, embeds.shape[1])])
        for t in (embeds, pos, *meta):
            torch._dynamo.mark_dynamic(t, 0)
        torch._dynamo.mark_dynamic(meta.block_tables, 1)
        return self.model(embeds, pos, self.kv_cache, meta, run_layer=self.compiled_layer)  # [B_pad, H]

    @torch.inference_mode()
    def _warm_up(self) -> None:
        """Compile now, on the padding block only: batch 2, table width 3 (distinct sizes, so the
        two dynamic dimensions get separate symbols)."""
        start = time.perf_counter()
        embeds = torch.zeros(MIN_DYNAMIC, self.config.hidden_size, dtype=self.act_dtype, device=self.device)
        self._run_compiled(embeds, [0] * MIN_DYNAMIC, [[self.pad_block] * 3] * MIN_DYNAMIC)
        for pool in (t for pair in self.kv_cache for t in pair):
            pool[self.pad_block].zero_()
        logger.info("compiled the decode step in %.1f s", time.perf_counter() - start)

    # ---- general steps (prefill chunks, recompute after preemption, mixed) -------------------

    def prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, AttentionMetadata]:
        # NOTE: sequence b feeds positions [start, start + n) where start = num_computed_tokens[b];
        # decode rows are the newest generated token, prefill rows a chunk of the prompt (or, after
        # preemption, of prompt + generated tokens). Each row is embedded as the model saw it when it
        # was first fed, so a recomputed sequence rebuilds exactly the same KV.
        ids, masks, speaker_rows = [], [], []
        offset = 0
        for seq, start, n in zip(batch.seqs, batch.num_computed_tokens, batch.num_new_tokens):
            row_ids, row_mask = seq.rows(start, start + n)  # [n, num_vq], [n]
            ids.append(row_ids)
            masks.append(row_mask)
            speaker_rows += _speaker_rows(seq, start, n, offset)
            offset += n
        embeds = self.embed.embed(torch.cat(ids).to(self.device), torch.cat(masks).to(self.device))
        for row, vector in speaker_rows:
            embeds[row] = vector.to(embeds)
        meta = build_attention_metadata(
            q_lens=list(batch.num_new_tokens),
            k_lens=[s + n for s, n in zip(batch.num_computed_tokens, batch.num_new_tokens)],
            block_tables=[seq.block_table for seq in batch.seqs],
            block_size=self.block_size,
            device=self.device,
        )
        return embeds.to(self.act_dtype), meta

    # ---- sampling -------------------------------------------------------------------------------

    def sample(self, batch: ScheduledBatch, last: torch.Tensor) -> torch.Tensor:
        """tokens [B, num_vq]; code and text sequences are sampled with their own heads (in fp32)."""
        tokens = torch.zeros(batch.num_seqs, self.config.num_vq, dtype=torch.int64)
        for is_text in (False, True):
            index = [b for b, seq in enumerate(batch.seqs) if batch.sample[b] and seq.is_text == is_text]
            if not index:
                continue
            seqs = [batch.seqs[b] for b in index]
            hidden = last if len(index) == batch.num_seqs else last[index]  # [S, H]
            if is_text:
                logits, rows = self.embed.text_logits(hidden), 1  # [S, V_text]
            else:
                logits = self.embed.code_logits(hidden)  # [S, 4, V_audio]
                rows = logits.shape[1]
                logits = logits.reshape(-1, logits.shape[-1])  # [S * 4, V], row s*4 + q
            sampled = self.sampler.sample(logits, self.sampler.prepare(seqs, rows))  # [S, rows]
            tokens[index, :rows] = sampled.cpu()
        return tokens


def _speaker_rows(seq: Sequence, start: int, n: int, offset: int) -> list[tuple[int, torch.Tensor]]:
    """Packed rows of this chunk whose embedding is replaced by the speaker vector."""
    spk = seq.prompt.spk_emb
    if spk is None:
        return []
    return [(offset + p - start, spk) for p in seq.prompt.spk_positions if start <= p < start + n]
