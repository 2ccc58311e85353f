"""Engine stage: run one scheduled step — embed the new positions, run the paged Llama, sample.

In: ScheduledBatch (sequences, their new positions, block tables). Out: StepOutput (tokens [B, 4]
and the last-position hidden states [B, H] that predicted them).
"""
from __future__ import annotations

import torch

from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.sampler import Sampler
from chattts_velocity.engine.scheduler import ScheduledBatch, StepOutput
from chattts_velocity.engine.sequence import Sequence
from chattts_velocity.model import (
    AttentionMetadata,
    ChatTTSLlama,
    Embed,
    allocate_kv_cache,
    build_attention_metadata,
    forward_context,
)


class ModelRunner:
    """Owns the KV pool, the model and the sampler; sees sequences only through ScheduledBatch."""

    def __init__(
        self, model: ChatTTSLlama, embed: Embed, config: ModelConfig, engine_config: EngineConfig, num_blocks: int
    ) -> None:
        self.model, self.embed, self.config = model.eval(), embed.eval(), config
        self.block_size = engine_config.block_size
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.kv_cache = allocate_kv_cache(
            config.num_hidden_layers, num_blocks, self.block_size, config.num_attention_heads,
            config.head_dim, self.dtype, self.device,
        )
        self.sampler = Sampler()

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepOutput:
        embeds, meta = self.prepare(batch)  # [N_new, H]
        with forward_context(meta):
            hidden = self.model(embeds, meta.positions, self.kv_cache)  # [N_new, H]
        last = hidden[meta.last_indices].float()  # [B, H], the states that predict this step's tokens
        tokens = self.sample(batch, last)  # [B, num_vq]
        return StepOutput(tokens=tokens, hidden=last, sampled=list(batch.sample))

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
        return embeds.to(self.dtype), meta

    def sample(self, batch: ScheduledBatch, last: torch.Tensor) -> torch.Tensor:
        """tokens [B, num_vq]; code and text sequences are sampled with their own heads."""
        tokens = torch.zeros(batch.num_seqs, self.config.num_vq, dtype=torch.int64)
        for is_text in (False, True):
            index = [b for b, seq in enumerate(batch.seqs) if batch.sample[b] and seq.is_text == is_text]
            if not index:
                continue
            seqs = [batch.seqs[b] for b in index]
            hidden = last[index]  # [S, H]
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
