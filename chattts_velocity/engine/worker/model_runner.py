"""Engine stage: run one scheduled step — embed the new positions, run the paged Llama, sample.

In: ScheduledBatch (sequences, their new positions, block tables). Out: StepOutput (tokens [B, 4]
and the last-position hidden states [B, H] that predicted them).
"""
from __future__ import annotations

import contextlib
import logging

import torch

from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.sched.decode_batch import DecodeBatch
from chattts_velocity.engine.sched.sequence import Sequence
from chattts_velocity.engine.sched.step import ScheduledBatch, StepOutput
from chattts_velocity.engine.worker.backends import DecodeBackend
from chattts_velocity.engine.worker.backends.cuda_graphs import graph_batch_sizes
from chattts_velocity.engine.worker.backends.select import select_backend
from chattts_velocity.engine.worker.backends.step_graph import StepGraphs, steady_step
from chattts_velocity.engine.worker.overlap import InFlight, Readback
from chattts_velocity.engine.worker.sampling.device_sampler import DeviceSampler
from chattts_velocity.engine.worker.sampling.sampler import Sampler, SamplingBatch
from chattts_velocity.engine.worker.step_inputs import BlockTables, PagedKV, StepTensors, step_tensors, to_device
from chattts_velocity.model import ChatTTSLlama, Embed, allocate_kv_pairs

logger = logging.getLogger("chattts_velocity")


class ModelRunner:
    """Owns the KV pool, the model, the decode backend (and through it the sampler); sees sequences only through
    ScheduledBatch.

    The backend (worker/backends/: torch eager or compiled, the fused C++ layers, or triton) is chosen once, here,
    and runs every step. Per step the runner builds the embeddings of the new positions and the step's integer
    inputs once (step_inputs.StepTensors, block tables from a persistent buffer); the backend derives its own metadata.
    """

    def __init__(
        self, model: ChatTTSLlama, embed: Embed, config: ModelConfig, engine_config: EngineConfig, num_blocks: int,
    ) -> None:
        self.model, self.embed, self.config = model.eval(), embed.eval(), config
        self.block_size = engine_config.block_size
        self.device = next(model.parameters()).device
        self.kv_dtype, self.act_dtype = engine_config.precision.kv_cache, engine_config.precision.activations
        # one block beyond the scheduler's pool: the write target of padding rows in compiled steps
        self.kv_cache = allocate_kv_pairs(
            config.num_hidden_layers, num_blocks + 1, self.block_size, config.num_attention_heads,
            config.head_dim, self.kv_dtype, self.device,
        )
        kv = PagedKV(self.kv_cache, self.block_size, pad_block=num_blocks, device=self.device)
        self.backend: DecodeBackend = select_backend(engine_config, model, kv)
        logger.info("decode backend: %s", self.backend.name)
        self.embed.head_gemm = getattr(self.backend, "head_gemm", None)  # the heads' row-invariant GEMM, if any
        width = -(-engine_config.max_model_len // self.block_size)
        self.block_tables = BlockTables(2 * engine_config.max_num_seqs, width, self.device)
        self._positions: tuple[DecodeBatch, torch.Tensor] | None = None  # a persistent batch's last positions [B]
        self.step_graphs = self._step_graphs(engine_config, width, num_blocks)
        # steady steps launched a step ahead of the host (engine/worker/overlap.py): where they run as one graph
        wanted = engine_config.overlap if engine_config.overlap is not None else self.device.type == "cuda"
        self.overlap = wanted and self.step_graphs is not None
        self.readback = Readback(self.device)

    def _step_graphs(self, engine_config: EngineConfig, width: int, pad_block: int) -> StepGraphs | None:
        """The triton backend's steady steps run as one graph each (captured on CUDA, eager on its buffers on CPU)."""
        sampler, layers = self.sampler, getattr(self.backend, "decode_step", None)
        if not isinstance(sampler, DeviceSampler) or layers is None:
            return None
        step = steady_step(self.embed, layers, sampler, self.act_dtype, self.block_size, self.config.num_vq)
        graphs = StepGraphs(step, graph_batch_sizes(engine_config.max_num_seqs), width, self.config.num_vq,
                            self.config.hidden_size, pad_block, self.device)
        with torch.inference_mode(), self._on_device():
            graphs.warm_up(self.config.num_vq)
        return graphs

    def _on_device(self) -> contextlib.AbstractContextManager[object]:
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    @property
    def sampler(self) -> Sampler:
        return self.backend.sampler

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> StepOutput:
        # every launch of the step (layers, heads, sampler) on the engine's device, not the current one
        with self._on_device():
            return self._run(batch)

    def _run(self, batch: ScheduledBatch) -> StepOutput:
        if batch.steady is not None:
            return self._run_steady(batch.steady)
        step = step_tensors(batch, self.block_tables, self.block_size)
        # one row per sequence is not enough for embed_decode: a one-row prompt chunk (the prefill budget's remainder,
        # or a recompute after preemption) feeds a prompt row, not the newest token
        embeds = self.embed_decode(batch) if batch.is_decode_only else self.embed_rows(batch)
        hidden = self.backend.run(embeds.to(self.act_dtype), step)  # [N, H]
        last = hidden if step.decode_only else hidden[to_device(step.last_indices(), hidden.device)]  # [B, H]
        last = last.float()
        failed: dict[int, Exception] = {}
        tokens = self.sample(batch, last, failed)  # [B, num_vq]
        return StepOutput(tokens=tokens, hidden=last, sampled=list(batch.sample), failed=failed)

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch) -> InFlight:
        """Start a steady step (batch.ahead 0 or 1) and the copy of its tokens to the host; collect() reads them."""
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            # mypy silenced below: the engine launches only steady batches
            tokens, last = self._steady_step(batch.steady, batch.ahead)  # type: ignore[arg-type]
            return self.readback.start(batch, tokens, last)

    def collect(self, step: InFlight) -> StepOutput:
        """The launched step's output (waits for its tokens)."""
        return StepOutput(tokens=self.readback.finish(step), hidden=step.hidden, sampled=[True] * step.batch.num_seqs)

    def _run_steady(self, state: DecodeBatch) -> StepOutput:
        tokens, last = self._steady_step(state, 0)
        return StepOutput(tokens=tokens.cpu(), hidden=last, sampled=[True] * len(state))

    def _steady_step(self, state: DecodeBatch, ahead: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A step of the persistent batch: the embedding ids are the tokens the last step sampled (still on the
        device), positions advance on the device, the sampler's inputs come from the batch's arrays; on the triton
        backend the whole step is one graph (engine/worker/backends/step_graph.py), the only path that runs a step ahead
        -> tokens [B, rows] and hidden [B, H] on the device."""
        tables = self.block_tables.steady_rows(state, ahead)
        if self.step_graphs is not None and self.step_graphs.covers(len(state)):
            # the graph's buffers hold the last replay's tokens: the host's go up only when it takes a new batch
            tokens, last = self.step_graphs.run(state, self.sampler, state.last_tokens, tables, ahead)
        elif ahead:
            raise RuntimeError("ModelRunner: a step ahead of the host runs only as a step graph")
        else:
            fresh = state.steps == 0 or self._positions is None or self._positions[0] is not state
            ids = to_device(state.last_tokens, self.device) if fresh else state.last_tokens
            # mypy silenced below: not fresh means a previous step of this batch left its positions
            positions = (to_device(torch.from_numpy(state.lengths - 1), self.device) if fresh
                         else self._positions[1] + 1)  # type: ignore[index]
            self._positions = (state, positions)
            tokens, last = self.decode(ids, positions, tables, state.lengths.tolist(),
                                       self.sampler.prepare_steady(state))
        state.last_tokens = tokens  # [B, rows] on the device: the next step's embedding ids
        return tokens, last

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, tables: torch.Tensor, k_lens: list[int],
               sampling: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The model work of a steady decode step: ids [B, num_vq], positions [B], block tables [B, w] on the
        device -> (sampled tokens [B, rows] on the device, last hidden states [B, H] fp32)."""
        step = StepTensors.decode(positions, k_lens, tables, self.block_size)
        last = self.backend.run(self.embed.embed_codes(ids).to(self.act_dtype), step).float()  # [B, H]
        logits = self.embed.logits_rowwise(last, "code")  # [B, rows, V]
        return self.sampler.sample(logits.reshape(-1, logits.shape[-1]), sampling), last

    def embed_decode(self, batch: ScheduledBatch) -> torch.Tensor:
        """[B, H]: each sequence feeds exactly its newest position (ids seq.last_row)."""
        ids = to_device(torch.tensor([seq.last_row for seq in batch.seqs], dtype=torch.int64), self.device)  # [B, 4]
        is_text = [seq.is_text for seq in batch.seqs]
        if not any(is_text):  # the usual decode step: code tokens only (and no mask to send)
            return self.embed.embed_codes(ids)
        return self.embed.embed(ids, to_device(torch.tensor(is_text, dtype=torch.bool), self.device))

    def embed_rows(self, batch: ScheduledBatch) -> torch.Tensor:
        """[N, H] of a general step (prefill chunks, recompute after preemption, mixed)."""
        # NOTE: sequence b feeds positions [start, start + n) where start = num_computed_tokens[b];
        # decode rows are the newest generated token, prefill rows a chunk of the prompt (or, after
        # preemption, of prompt + generated tokens). Each row is embedded as the model saw it when it
        # was first fed, so a recomputed sequence rebuilds exactly the same KV.
        ids, masks, speaker_rows = [], [], []
        last_rows: list[tuple[int, ...]] = []  # consecutive plain decode rows, sent as one tensor
        last_text: list[bool] = []

        def flush() -> None:
            if last_rows:
                ids.append(torch.tensor(last_rows, dtype=torch.int64))
                masks.append(torch.tensor(last_text, dtype=torch.bool))
                last_rows.clear()
                last_text.clear()

        offset = 0
        for seq, start, n, prefill in zip(batch.seqs, batch.num_computed_tokens, batch.num_new_tokens,
                                          batch.is_prefill, strict=True):
            if not prefill:
                last_rows.append(seq.last_row)
                last_text.append(seq.is_text)
            else:
                flush()
                row_ids, row_mask = seq.rows(start, start + n)  # [n, num_vq], [n]
                ids.append(row_ids)
                masks.append(row_mask)
                speaker_rows += _speaker_rows(seq, start, n, offset)
            offset += n
        flush()
        embeds = self.embed.embed(to_device(torch.cat(ids), self.device), to_device(torch.cat(masks), self.device))
        for row, vector in speaker_rows:
            embeds[row] = vector.to(embeds)
        return embeds

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
            sampled = self.sampler.sample(logits, sampling).cpu()  # [S, rows]: the step's one device-to-host copy
            if len(index) == batch.num_seqs and rows == tokens.shape[1]:
                tokens = sampled  # the usual step: every sequence samples codes
            else:
                tokens[index, :rows] = sampled
            failed.update((index[s], error) for s, error in sampling.params.failures.items())
        return tokens


def _speaker_rows(seq: Sequence, start: int, n: int, offset: int) -> list[tuple[int, torch.Tensor]]:
    """Packed rows of this chunk whose embedding is replaced by the speaker vector."""
    spk = seq.prompt.spk_emb
    if spk is None:
        return []
    return [(offset + p - start, spk) for p in seq.prompt.spk_positions if start <= p < start + n]
