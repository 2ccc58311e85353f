"""Engine stage: LLMEngine — add requests, step (schedule -> run -> postprocess), abort, stats.

In: (request_id, Prompt, SamplingParams). Out: per step, one GenerationOutput *delta* per request
that sampled or finished: the new token rows [n, rows] (n = 0 or 1) and their hidden states [n, H].
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time
from dataclasses import dataclass, field

import torch

from chattts_velocity.assets import AssetPaths
from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.beam_engine import BeamSearch
from chattts_velocity.engine.block_manager import BlockManager
from chattts_velocity.engine.model_runner import ModelRunner
from chattts_velocity.engine.scheduler import Scheduler
from chattts_velocity.engine.sequence import Sequence, SequenceStatus
from chattts_velocity.engine.step import ScheduledBatch, StepOutput
from chattts_velocity.model import kv_cache_bytes_per_block, load_embed, load_gpt
from chattts_velocity.schema import MAX_REGENERATE, GenerationOutput, Prompt, SamplingParams

logger = logging.getLogger("chattts_velocity")
DEFAULT_KV_BYTES = 1 << 30  # 1 GiB on CPU when the user gives no budget
DEFAULT_VRAM_FRACTION = 0.6  # on CUDA: of the VRAM still free once the weights are in (activations need the rest)
# EngineConfig.dtype -> (dtype of the checkpoint's weights and of the KV cache, PackedLinear mode).
# Activations stay float32 on CPU in every mode; the heads and the sampler always run in float32.
PRECISIONS: dict[str, tuple[torch.dtype, str | None]] = {
    "float32": (torch.float32, None),  # exact: the plain path's numbers
    "bfloat16": (torch.bfloat16, "bfloat16"),  # oneDNN-prepacked bf16 GEMMs, bf16 KV cache
    "float16": (torch.float16, "float16"),
    "int8": (torch.bfloat16, "int8"),  # weight-only int8 GEMMs (bf16 activations), bf16 KV cache
    "int4": (torch.bfloat16, "int4"),  # weight-only int4, a scale per 32 columns (cpu kernels), bf16 KV cache
}


@dataclass
class EngineStats:
    """Counters for /metrics and benchmarks (cumulative unless named last_*)."""

    num_steps: int = 0
    num_tokens_computed: int = 0  # positions run through the model (prefill + decode)
    num_tokens_sampled: int = 0  # generated steps (one step = 4 codes)
    busy_seconds: float = 0.0
    last_batch_size: int = 0
    last_step_seconds: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)  # recent steps' batch sizes (bounded)


class LLMEngine:
    def __init__(self, model, embed, config: ModelConfig, engine_config: EngineConfig) -> None:
        """model: a ChatTTSLlama already in engine_config.dtype's weight dtype (see from_assets)."""
        if engine_config.max_model_len > config.max_position_embeddings:  # RoPE has no positions beyond it
            logger.info("max_model_len %d -> %d (the model's max_position_embeddings)", engine_config.max_model_len,
                        config.max_position_embeddings)
            engine_config = dataclasses.replace(engine_config, max_model_len=config.max_position_embeddings)
        self.config, self.engine_config = config, engine_config
        kv_dtype, pack_mode = PRECISIONS[engine_config.dtype]
        if engine_config.kv_cache_dtype == "int8":  # EngineConfig allows it with the cpu backend's precisions only
            kv_dtype = torch.int8
        on_cuda = str(engine_config.device).startswith("cuda")
        # on CUDA the bf16/fp16 weights are used as loaded (cuBLAS): packing would add a fused copy of q/k/v, gate/up
        if pack_mode is not None and not (on_cuda and pack_mode in ("bfloat16", "float16")):
            model.pack_linears(pack_mode)
        num_blocks = kv_cache_blocks(config, engine_config, kv_dtype)
        self.block_manager = BlockManager(num_blocks, engine_config.block_size, engine_config.enable_prefix_caching)
        self.scheduler = Scheduler(engine_config, self.block_manager)
        self.runner = ModelRunner(model, embed, config, engine_config, num_blocks, kv_dtype=kv_dtype)
        self.stats = EngineStats()
        self.beams = BeamSearch(self.scheduler, self.runner.embed)  # requests with beam_width > 1
        self._retries: dict[str, int] = {}
        self._ids = itertools.count()

    @classmethod
    def from_assets(cls, paths: AssetPaths, **engine_kwargs) -> "LLMEngine":
        engine_config = EngineConfig.from_kwargs(**engine_kwargs)
        if engine_config.num_threads:
            torch.set_num_threads(engine_config.num_threads)
        dtype, _ = PRECISIONS[engine_config.dtype]
        config = ModelConfig.from_json(paths.gpt_config)
        model = load_gpt(paths.gpt_dir, config, dtype=dtype, device=engine_config.device)
        embed = load_embed(paths.embed, device=engine_config.device)
        return cls(model, embed, config, engine_config)

    @property
    def embed(self):
        return self.runner.embed

    def add_request(self, request_id: str | None, prompt: Prompt, params: SamplingParams) -> str:
        """Queue a request; it joins the running batch at the next step. Returns its id."""
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if params.beam_width > 1:
            return self.beams.add(request_id, prompt, params, arrival=time.monotonic())
        self.scheduler.add(Sequence(request_id, prompt, params, arrival=time.monotonic()))
        return request_id

    def abort_request(self, request_id: str) -> bool:
        self._retries.pop(request_id, None)
        return self.beams.abort(request_id) or self.scheduler.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[GenerationOutput]:
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return []
        start = time.perf_counter()
        try:
            out = self.runner.run(batch)
        except Exception as exc:  # noqa: BLE001 -- not attributable to one request: this step's requests fail
            logger.exception("engine step failed; failing its %d request(s), serving the others", batch.num_seqs)
            error = f"engine: a step failed ({exc!r}); this request was in it"
            return self.beams.after_step(batch, None, self._fail([(seq, RuntimeError(error)) for seq in batch.seqs]))
        failed = self._fail([(batch.seqs[b], error) for b, error in out.failed.items()])
        finished = self.scheduler.postprocess(batch, out)
        self._record(batch, time.perf_counter() - start)
        return self.beams.after_step(batch, out, failed + self._deltas(batch, out, finished))

    def _fail(self, failures: list[tuple[Sequence, Exception]]) -> list[GenerationOutput]:
        """Abort each sequence (its blocks are freed) and hand its error on as its last delta."""
        for seq, _ in failures:
            self.scheduler.abort(seq.request_id)
        return [GenerationOutput.failed(seq.request_id, error) for seq, error in failures]

    def _deltas(self, batch: ScheduledBatch, out: StepOutput, finished: list[Sequence]) -> list[GenerationOutput]:
        done = {seq.request_id for seq in finished if not self._retry_if_empty(seq)}
        outputs = []
        # one [1, rows] / [1, H] view per sequence from one unbind each (per-row slicing costs a few us a row)
        token_rows = out.tokens.unsqueeze(1).unbind(0)
        hidden_rows = out.hidden.unsqueeze(1).unbind(0) if out.hidden is not None else None
        width = out.tokens.shape[1]
        for b, seq in enumerate(batch.seqs):
            if not batch.sample[b]:
                continue
            status = seq.status
            finished = status.is_finished
            if finished and seq.request_id not in done:
                continue
            generated = len(seq.generated)
            appended = generated > 0 and status is not SequenceStatus.FINISHED_EOS
            hidden = hidden_rows[b] if (appended and seq.params.return_hidden and hidden_rows) else None
            tokens = token_rows[b] if appended else out.tokens[:0]
            outputs.append(GenerationOutput(
                request_id=seq.request_id,
                token_ids=tokens if seq.num_rows == width else tokens[:, : seq.num_rows],  # [n, rows]
                hidden=hidden,  # [n, H]
                finished=finished,
                finish_reason=status.value if finished else None,
                extra={"num_generated": generated},
            ))
        return outputs

    def _retry_if_empty(self, seq: Sequence) -> bool:
        """Upstream's ensure_non_empty, bounded: re-run an unseeded request whose first token was EOS."""
        p = seq.params
        if seq.finish_reason != "eos" or seq.num_generated or p.seed is not None or not p.ensure_non_empty:
            return False
        tries = self._retries.get(seq.request_id, 0)
        if tries >= MAX_REGENERATE:
            self._retries.pop(seq.request_id, None)
            return False
        logger.warning("request %s ended at its first step; regenerating (%d/%d)", seq.request_id, tries + 1,
                       MAX_REGENERATE)
        self._retries[seq.request_id] = tries + 1
        self.scheduler.add(Sequence(seq.request_id, seq.prompt, p, arrival=seq.arrival))
        return True

    def _record(self, batch: ScheduledBatch, seconds: float) -> None:
        s = self.stats
        s.num_steps += 1
        s.num_tokens_computed += batch.num_tokens
        s.num_tokens_sampled += sum(batch.sample)
        s.busy_seconds += seconds
        s.last_batch_size, s.last_step_seconds = batch.num_seqs, seconds
        s.batch_sizes = (s.batch_sizes + [batch.num_seqs])[-256:]

    def metrics(self) -> dict[str, float | str]:
        return {
            "backend": self.runner.backend.name,
            "num_waiting": len(self.scheduler.waiting),
            "num_running": len(self.scheduler.running),
            "kv_cache_usage": self.block_manager.usage,
            "num_steps": self.stats.num_steps,
            "num_tokens_sampled": self.stats.num_tokens_sampled,
            "num_preemptions": self.scheduler.num_preemptions,
            "steps_per_second": self.stats.num_tokens_sampled / max(self.stats.busy_seconds, 1e-9),
        }


def kv_cache_blocks(config: ModelConfig, engine_config: EngineConfig, dtype: torch.dtype) -> int:
    """Blocks that fit the user's KV budget (bytes, or a fraction of RAM / VRAM); clear error if too few.

    Without a budget on CPU: 1 GiB, but no more than max_num_seqs sequences of max_model_len positions need.
    """
    per_block = kv_cache_bytes_per_block(
        config.num_hidden_layers, engine_config.block_size, config.num_attention_heads, config.head_dim, dtype
    )
    budget = _budget_bytes(engine_config.kv_cache_memory, engine_config.device)
    num_blocks = int(budget // per_block)
    needed = -(-engine_config.max_model_len // engine_config.block_size)
    if engine_config.kv_cache_memory is None:
        # the defaults (1 GiB on CPU, zero-filled: all resident; a fraction of free VRAM on CUDA) never exceed what
        # max_num_seqs full-length sequences can hold at once (64 x 4096 positions of ChatTTS: ~16 GB in bf16, where
        # 0.6 of an H100's free VRAM would be ~46 GB); a tiny model's pool shrinks to that
        num_blocks = min(num_blocks, engine_config.max_num_seqs * needed)
    if num_blocks < needed:
        raise ValueError(
            f"kv_cache_memory: {budget / 2**20:.1f} MiB holds {num_blocks} KV blocks of {engine_config.block_size} "
            f"positions, but one sequence of max_model_len={engine_config.max_model_len} needs {needed} "
            f"({needed * per_block / 2**20:.1f} MiB); raise kv_cache_memory or lower max_model_len"
        )
    logger.info("KV cache: %d blocks of %d positions = %.1f MiB on %s (%d sequences of max_model_len=%d fit)",
                num_blocks, engine_config.block_size, num_blocks * per_block / 2**20, engine_config.device,
                num_blocks // needed, engine_config.max_model_len)
    return num_blocks


def _budget_bytes(value: int | float | None, device: str) -> float:
    """Bytes for the KV pool: a number of bytes, or a fraction of the device's memory (of the FREE VRAM on CUDA,
    measured after the weights are loaded); None: 1 GiB on CPU, DEFAULT_VRAM_FRACTION of free VRAM on CUDA."""
    on_cuda = str(device).startswith("cuda")
    if value is None:
        value = DEFAULT_VRAM_FRACTION if on_cuda else DEFAULT_KV_BYTES
    if isinstance(value, float) and 0 < value <= 1:
        if on_cuda:
            return value * torch.cuda.mem_get_info(torch.device(device))[0]
        return value * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if value <= 0:
        raise ValueError(f"kv_cache_memory: must be > 0 bytes or a fraction in (0, 1], got {value!r}")
    return float(value)
