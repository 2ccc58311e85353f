"""Engine stage: LLMEngine — add requests, step (schedule -> run -> postprocess), abort, stats.

In: (request_id, Prompt, SamplingParams). Out: per step, StepDeltas (engine/sched/step.py): a steady step's new rows
as one block, every other delta one by one; step() gives them as one GenerationOutput *delta* per request that sampled
or finished: the new token rows [n, rows] (n = 0 or 1) and their hidden states [n, H].
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from chattts_velocity.assets import AssetPaths
from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.beams.velocity import BeamSearch
from chattts_velocity.engine.loading.kv_sizing import kv_cache_blocks
from chattts_velocity.engine.loading.weights import load_weights, pack_for
from chattts_velocity.engine.sched.admission import check_fits
from chattts_velocity.engine.sched.block_manager import BlockManager
from chattts_velocity.engine.sched.retry import RetryOnEmpty
from chattts_velocity.engine.sched.scheduler import Scheduler
from chattts_velocity.engine.sched.sequence import Sequence, SequenceStatus
from chattts_velocity.engine.sched.step import ScheduledBatch, SteadyRows, StepDeltas, StepOutput
from chattts_velocity.engine.worker.model_runner import ModelRunner
from chattts_velocity.engine.worker.overlap import InFlight
from chattts_velocity.model import ChatTTSLlama, Embed
from chattts_velocity.schema import GenerationOutput, Prompt, SamplingParams

logger = logging.getLogger("chattts_velocity")


@dataclass
class EngineStats:
    """Counters for /metrics and benchmarks (cumulative unless named last_*)."""

    num_steps: int = 0
    num_tokens_computed: int = 0  # positions run through the model (prefill + decode)
    num_tokens_sampled: int = 0  # generated steps (one step = 4 codes)
    num_steady_steps: int = 0  # steps run on the persistent decode batch (engine/sched/decode_batch.py)
    num_ahead_steps: int = 0  # steady steps launched before the previous step's tokens were read
    busy_seconds: float = 0.0
    last_batch_size: int = 0
    last_step_seconds: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)  # recent steps' batch sizes (the last 256 to 512)


class LLMEngine:
    def __init__(self, model: ChatTTSLlama, embed: Embed, config: ModelConfig, engine_config: EngineConfig) -> None:
        """model: a ChatTTSLlama in engine_config.precision's weight dtype (see from_assets); packed here."""
        if engine_config.max_model_len > config.max_position_embeddings:  # RoPE has no positions beyond it
            logger.info("max_model_len %d -> %d (the model's max_position_embeddings)", engine_config.max_model_len,
                        config.max_position_embeddings)
            engine_config = dataclasses.replace(engine_config, max_model_len=config.max_position_embeddings)
        self.config, self.engine_config = config, engine_config
        logger.info("%s", engine_config.precision.describe())
        pack_for(model, engine_config.precision)
        num_blocks = kv_cache_blocks(config, engine_config)
        self.block_manager = BlockManager(num_blocks, engine_config.block_size, engine_config.enable_prefix_caching)
        self.scheduler = Scheduler(engine_config, self.block_manager)
        self.runner = ModelRunner(model, embed, config, engine_config, num_blocks)
        self.stats = EngineStats()
        self.beams = BeamSearch(self.scheduler, self.runner.embed)  # requests with beam_width > 1
        self.retries = RetryOnEmpty()
        self._ids = itertools.count()
        self.in_flight: InFlight | None = None  # a steady step launched, its tokens not read (engine/worker/overlap.py)

    @classmethod
    def from_assets(cls, paths: AssetPaths, **engine_kwargs: Any) -> LLMEngine:
        engine_config = EngineConfig.from_kwargs(**engine_kwargs)
        if engine_config.num_threads:
            torch.set_num_threads(engine_config.num_threads)
        config = ModelConfig.from_json(paths.gpt_config)
        return cls(*load_weights(paths, config, engine_config), config, engine_config)

    @property
    def embed(self) -> Embed:
        return self.runner.embed

    def add_request(self, request_id: str | None, prompt: Prompt, params: SamplingParams, client: str = "") -> str:
        """Queue a request; it joins the running batch at the next step. Returns its id. `client` names who sent it:
        admission takes turns between clients (engine/sched/admission.py)."""
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if params.beam_width > 1:
            return self.beams.add(request_id, prompt, params, arrival=time.monotonic(), client=client)
        seq = Sequence(request_id, prompt, params, arrival=time.monotonic())
        seq.client = client
        self.scheduler.add(seq)
        return request_id

    def check_request(self, prompt: Prompt, params: SamplingParams) -> None:
        """The ValueError add_request would raise for this request's size (positions, blocks, beams), queuing
        nothing; reads only what never changes, so any thread may call it."""
        seq = Sequence("check", prompt, params)
        if params.beam_width > 1:
            seq.seat_group = ("check", params.beam_width)
        check_fits(seq, self.engine_config, self.block_manager)

    def abort_request(self, request_id: str) -> bool:
        self.retries.forget(request_id)
        return self.beams.abort(request_id) or self.scheduler.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or self.in_flight is not None

    def step(self) -> list[GenerationOutput]:
        """One step's deltas, one per request (StepDeltas.outputs)."""
        return self.step_deltas().outputs()

    def step_deltas(self) -> StepDeltas:
        """One step's deltas. With the runner's overlap on, a steady step is launched, then the next one (when the
        batch stays), then the first one's tokens are read: each call returns the deltas of one step."""
        step, self.in_flight = self.in_flight, None
        if step is None:
            batch = self.scheduler.schedule()
            if not batch.seqs:
                return StepDeltas()
            if not (self.runner.overlap and batch.steady is not None):
                return self._run(batch)
            try:
                step = self.runner.launch(batch)
            except Exception as exc:  # noqa: BLE001 -- not attributable to one request: this step's requests fail
                return self._failed_step(batch, exc)
        ahead = self.scheduler.schedule_ahead(step.batch.steady) if step.batch.steady is not None else None
        try:
            if ahead is not None:
                self.block_manager.hold()  # the step ahead may write the KV of sequences that end with this one
                self.in_flight = self.runner.launch(ahead)
            out = self.runner.collect(step)
        except Exception as exc:  # noqa: BLE001 -- as above; the step ahead fails with it
            self.in_flight = None
            self.block_manager.release()
            return self._failed_step(step.batch, exc)
        if self.in_flight is None:
            self.block_manager.release()  # nothing in flight: held blocks go back to the pool
        return self._finish(step.batch, out, step.start)

    def _run(self, batch: ScheduledBatch) -> StepDeltas:
        """A step run synchronously: launched, its tokens read, the sequences updated."""
        start = time.perf_counter()
        try:
            out = self.runner.run(batch)
        except Exception as exc:  # noqa: BLE001 -- not attributable to one request: this step's requests fail
            return self._failed_step(batch, exc)
        return self._finish(batch, out, start)

    def _finish(self, batch: ScheduledBatch, out: StepOutput, start: float) -> StepDeltas:
        failed = self._fail([(batch.seqs[b], error) for b, error in out.failed.items()])
        self._record(batch, self._sampled_rows(batch), time.perf_counter() - start)
        finished = self.scheduler.postprocess(batch, out)
        if batch.steady is None:  # a general step (or the batch changed while it ran): per sequence
            return StepDeltas(others=self.beams.after_step(batch, out, failed + self._deltas(batch, out, finished)))
        state = batch.steady
        deltas = StepDeltas(SteadyRows(state.request_ids, out.tokens, out.hidden if state.any_hidden else None,
                                       state.keeps_hidden, state.generated.copy()))
        if len(state.ended):  # the slots that ended, one by one; the block keeps the others' rows
            ended = state.ended.tolist()
            done = {seq.request_id for seq in finished if not self._retry(seq)}
            deltas.ended = [(b, self._delta(state.seqs[b], b, out)) for b in ended
                            if state.seqs[b].request_id in done]
            deltas.steady.live = np.ones(len(state), dtype=bool)  # type: ignore[union-attr]  # set above
            deltas.steady.live[ended] = False  # type: ignore[union-attr]
        deltas.others = self.beams.after_step(batch, out, failed)
        return deltas

    def _failed_step(self, batch: ScheduledBatch, exc: Exception) -> StepDeltas:
        logger.exception("engine step failed; failing its %d request(s), serving the others", batch.num_seqs)
        error = f"engine: a step failed ({exc!r}); this request was in it"
        live = [seq for seq in batch.seqs if not seq.status.is_finished]
        return StepDeltas(others=self.beams.after_step(batch, None,
                                                       self._fail([(seq, RuntimeError(error)) for seq in live])))

    def _fail(self, failures: list[tuple[Sequence, Exception]]) -> list[GenerationOutput]:
        """Abort each sequence (its blocks are freed) and hand its error on as its last delta."""
        for seq, _ in failures:
            self.scheduler.abort(seq.request_id)
        return [GenerationOutput.failed(seq.request_id, error) for seq, error in failures]

    def _deltas(self, batch: ScheduledBatch, out: StepOutput, finished: list[Sequence]) -> list[GenerationOutput]:
        done = {seq.request_id for seq in finished if not self._retry(seq)}
        return [self._delta(seq, b, out) for b, seq in enumerate(batch.seqs)
                if batch.sample[b] and (not seq.status.is_finished or seq.request_id in done)]

    @staticmethod
    def _delta(seq: Sequence, b: int, out: StepOutput) -> GenerationOutput:
        """Sequence b's delta of a step it sampled in: its new row [1, rows] (none when it ended at EOS) and the
        hidden state [1, H] that predicted it."""
        status = seq.status
        ended = status.is_finished
        generated = seq.num_generated
        appended = generated > 0 and status is not SequenceStatus.FINISHED_EOS
        tokens = out.tokens[b: b + 1, : seq.num_rows] if appended else out.tokens[:0, : seq.num_rows]
        hidden = out.hidden[b: b + 1] if appended and seq.params.return_hidden and out.hidden is not None else None
        return GenerationOutput(request_id=seq.request_id, token_ids=tokens, hidden=hidden, finished=ended,
                                finish_reason=seq.finish_reason if ended else None,
                                extra={"num_generated": generated})

    def _retry(self, seq: Sequence) -> bool:
        """Queue the request again when upstream's ensure_non_empty asks for it (engine/sched/retry.py)."""
        again = self.retries.again(seq)
        if again is not None:
            self.scheduler.add(again)
        return again is not None

    def _sampled_rows(self, batch: ScheduledBatch) -> int:
        """Sampled rows that reach a sequence: a step run ahead also computed a row for each sequence that ended or
        was aborted with the step before it (or while it ran), and that row is dropped."""
        if batch.ahead and self.scheduler.changed:
            return sum(seq.status is SequenceStatus.RUNNING for seq in batch.seqs)
        return batch.num_seqs if batch.steady is not None else sum(batch.sample)

    def _record(self, batch: ScheduledBatch, sampled: int, seconds: float) -> None:
        s = self.stats
        s.num_steps += 1
        s.num_tokens_computed += batch.num_seqs if batch.steady is not None else batch.num_tokens
        s.num_tokens_sampled += sampled
        s.num_steady_steps += batch.steady is not None
        s.num_ahead_steps += batch.ahead
        s.busy_seconds += seconds
        s.last_batch_size, s.last_step_seconds = batch.num_seqs, seconds
        s.batch_sizes.append(batch.num_seqs)
        if len(s.batch_sizes) > 512:  # keep the last 256 (trimmed now and then, not copied every step)
            del s.batch_sizes[:-256]

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


