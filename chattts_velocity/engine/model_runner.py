"""Engine stage: run one scheduled step — embed the new positions, run the paged Llama, sample.

In: ScheduledBatch (sequences, their new positions, block tables). Out: StepOutput (tokens [B, 4]
and the last-position hidden states [B, H] that predicted them).
"""
from __future__ import annotations

import logging

import torch

from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.backends import DecodeBackend, PagedKV, select_backend
from chattts_velocity.engine.device_sampler import DeviceSampler, to_device
from chattts_velocity.engine.sampler import Sampler
from chattts_velocity.engine.sequence import Sequence
from chattts_velocity.engine.step import ScheduledBatch, StepOutput
from chattts_velocity.model import AttentionMetadata, ChatTTSLlama, Embed, allocate_kv_pairs, build_attention_metadata

logger = logging.getLogger("chattts_velocity")


class ModelRunner:
    """Owns the KV pool, the model, the decode backend and the sampler; sees sequences only through ScheduledBatch.

    The backend (engine/backends.py: torch eager or compiled, the fused C++ layers, or triton) is chosen once, here,
    and runs every step; with it the sampler (the triton backend's is engine/device_sampler.py's). Decode-only steps (every sequence feeds its newest token) take a lean path: inputs are built
    from each sequence's last row and block table with a few list comprehensions and one tensor per field.
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
        kv = PagedKV(self.kv_cache, self.block_size, pad_block=num_blocks, device=self.device)
        self.backend: DecodeBackend = select_backend(engine_config, model, kv, self.act_dtype)
        logger.info("decode backend: %s", self.backend.name)
        # the one choice of sampler: the triton backend's steps sample on the device (only the ids come back)
        self.sampler = DeviceSampler() if self.backend.name == "triton" else Sampler()

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepOutput:
        if batch.is_decode_only:
            last = self.run_decode(batch)  # [B, H]
        else:
            embeds, meta = self.prepare(batch)  # [N_new, H]
            hidden = self.backend.forward(embeds, meta)  # [N_new, H]
            last = hidden[meta.last_indices]  # [B, H], the states that predict this step's tokens
        last = last.float()
        failed: dict[int, Exception] = {}
        tokens = self.sample(batch, last, failed)  # [B, num_vq]
        return StepOutput(tokens=tokens, hidden=last, sampled=list(batch.sample), failed=failed)

    # ---- decode-only steps --------------------------------------------------------------------

    def run_decode(self, batch: ScheduledBatch) -> torch.Tensor:
        """hidden [B, H] of a step where each sequence feeds exactly its newest position."""
        seqs, positions = batch.seqs, batch.num_computed_tokens
        ids = torch.tensor([seq.last_row for seq in seqs], dtype=torch.int64)  # [B, num_vq]
        text = torch.tensor([seq.is_text for seq in seqs], dtype=torch.bool)  # [B]
        embeds = self.embed.embed(to_device(ids, self.device), to_device(text, self.device)).to(self.act_dtype)
        bs = self.block_size
        tables = [seq.block_table[: p // bs + 1] for seq, p in zip(seqs, positions)]
        return self.backend.decode(embeds, positions, tables)

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

    def sample(self, batch: ScheduledBatch, last: torch.Tensor, failed: dict[int, Exception]) -> torch.Tensor:
        """tokens [B, num_vq]; code and text sequences are sampled with their own heads (in fp32).

        A sequence whose own logits processors raised is put in failed[b]; its row of tokens is meaningless.
        """
        tokens = torch.zeros(batch.num_seqs, self.config.num_vq, dtype=torch.int64)
        for is_text in (False, True):
            index = [b for b, seq in enumerate(batch.seqs) if batch.sample[b] and seq.is_text == is_text]
            if not index:
                continue
            seqs = [batch.seqs[b] for b in index]
            hidden = last if len(index) == batch.num_seqs else last[index]  # [S, H]
            if is_text:
                logits, rows = self.embed.logits_rowwise(hidden, "text"), 1  # [S, V_text]
            else:
                logits = self.embed.logits_rowwise(hidden, "code")  # [S, 4, V_audio]
                rows = logits.shape[1]
                logits = logits.reshape(-1, logits.shape[-1])  # [S * 4, V], row s*4 + q
            sampling = self.sampler.prepare(seqs, rows)
            sampled = self.sampler.sample(logits, sampling)  # [S, rows]
            tokens[index, :rows] = sampled.cpu()
            failed.update((index[s], error) for s, error in sampling.params.failures.items())
        return tokens


def _speaker_rows(seq: Sequence, start: int, n: int, offset: int) -> list[tuple[int, torch.Tensor]]:
    """Packed rows of this chunk whose embedding is replaced by the speaker vector."""
    spk = seq.prompt.spk_emb
    if spk is None:
        return []
    return [(offset + p - start, spk) for p in seq.prompt.spk_positions if start <= p < start + n]
