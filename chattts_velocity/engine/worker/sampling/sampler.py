"""Engine stage: per-row sampling of the next tokens.

In: the sequences that sample this step and their logits [S*rows, V] (row s*rows + q is
codebook q of sequence s). Out: tokens [S, rows] int64.
"""
from __future__ import annotations

import array
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from chattts_velocity.engine.sched.decode_batch import DecodeBatch
from chattts_velocity.engine.sched.sequence import Sequence
from chattts_velocity.engine.worker.sampling import logits_processors as lp
from chattts_velocity.model import kernels

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def step_seed(seed: int, step: int) -> int:
    """Counter-based seed of a request's noise at generated step `step` (0 = first token).

    splitmix64(splitmix64(seed) XOR step): a pure function of (seed, step), so a request's
    noise never depends on the rest of the batch, on its position in it, or on preemption.
    """
    return _splitmix64(_seed_key(seed) ^ step)


@functools.lru_cache(maxsize=1 << 14)
def _seed_key(seed: int) -> int:
    return _splitmix64(seed & _MASK64)


@dataclass
class SamplingBatch:
    """One step's sampling inputs, built on CPU by Sampler.prepare."""

    params: lp.RowParams  # the processor chain's per-row parameters
    noise_seeds: list[int]  # [S] step_seed(seq.seed, len(seq.generated))
    seed_bits: np.ndarray | None = None  # [S] uint64, the same seeds as an array (a steady step's)


class Sampler:
    """prepare(seqs) -> SamplingBatch on CPU, then sample(logits, batch) -> tokens.

    Noise is drawn on CPU from step_seed(seq.seed, step) and copied to the logits' device, so a
    seed gives the same noise on every device. Unlike the reference's manual_seed, which
    re-seeds with the same value at every step (the same noise each step), the noise changes
    from step to step.
    """

    def __init__(self) -> None:
        self._generator = torch.Generator(device="cpu")  # re-seeded per (request, step)
        self._static: StaticCache = {}  # the fixed per-row parameters of the last batch, per row count

    def prepare(self, seqs: list[Sequence], num_rows: int) -> SamplingBatch:
        if any(seq.num_rows != num_rows for seq in seqs):
            raise ValueError(
                f"Sampler.prepare: every sequence must sample {num_rows} rows (one mode per call)"
            )
        if any(seq.seed is None for seq in seqs):
            raise ValueError("Sampler.prepare: every sequence needs a seed (Scheduler.add assigns one)")
        # mypy silenced below: no seed is None (checked above)
        noise_seeds = [step_seed(seq.seed, seq.num_generated) for seq in seqs]  # type: ignore[arg-type]
        return SamplingBatch(_row_params(seqs, num_rows, self._static), noise_seeds)

    def static_rows(self, state: DecodeBatch) -> StaticRows:
        """The per-row parameters fixed while the persistent batch stays (cached)."""
        return _static_rows(state.seqs, state.rows, self._static)

    def prepare_steady(self, state: DecodeBatch) -> SamplingBatch:
        """prepare(state.seqs, state.rows) from the persistent batch's arrays: no per-sequence Python."""
        rows = state.rows
        static = _static_rows(state.seqs, rows, self._static)
        history = torch.from_numpy(state.history.reshape(len(state) * rows, -1))  # [S*rows, W], any order
        below = state.generated < state.min_new
        mask_eos = torch.from_numpy(np.repeat(below, rows)) if below.any() else state.no_eos_mask
        params = lp.RowParams(rows_per_seq=rows, temperatures=static.temperatures, eos_ids=static.eos_ids,
                              mask_eos=mask_eos, penalties=static.penalties if history.shape[1] > 0 else None,
                              history=history, top_p=static.top_p, top_k=static.top_k)
        seeds = state.noise_seeds()
        return SamplingBatch(params, seeds.tolist(), seeds)

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """logits [S*rows, V] (any float dtype, any device; not modified) -> tokens [S, rows] int64.

        On CPU with the C++ kernels loaded and no custom processors, one op (sample_rows) does all of it: the same
        bits as the torch steps below, without their many small calls."""
        ops = kernels.active_ops
        if ops is not None and logits.is_cpu and not batch.params.custom:
            return _sample_rows(ops, logits, batch)
        return self.sample_torch(logits, batch)

    @torch.inference_mode()
    def sample_torch(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """sample in torch's ops: the processor chain, softmax, the seeded noise, argmax."""
        logits = lp.process(logits.to(torch.float32, copy=True), batch.params)
        probs = logits.softmax(dim=-1)
        # argmax(p / E), E ~ Exp(1), is exactly how torch.multinomial draws one sample
        noise = self._noise(batch, logits.shape[1]).to(logits.device)
        return probs.div_(noise).argmax(dim=-1).view(-1, batch.params.rows_per_seq)

    def _noise(self, batch: SamplingBatch, vocab: int) -> torch.Tensor:
        """Exp(1) noise [S*rows, V] on CPU; each request's block comes from its own (seed, step)."""
        rows = batch.params.rows_per_seq
        noise = torch.empty(len(batch.noise_seeds) * rows, vocab, dtype=torch.float32)
        for s, seed in enumerate(batch.noise_seeds):
            self._generator.manual_seed(seed)
            noise[s * rows:(s + 1) * rows].exponential_(generator=self._generator)
        return noise


_NONE = torch.empty(0)


def _sample_rows(ops: Any, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    params = batch.params
    seeds = batch.seed_bits if batch.seed_bits is not None else np.array(batch.noise_seeds, dtype=np.uint64)
    history = params.history if params.history is not None and params.penalties is not None else _NONE
    tokens: torch.Tensor = ops.sample_rows(
        logits.to(torch.float32), params.temperatures, _NONE if params.penalties is None else params.penalties,
        history, _NONE if params.top_p is None else params.top_p, _NONE if params.top_k is None else params.top_k,
        params.mask_eos, params.eos_ids, torch.from_numpy(seeds.view(np.int64)), params.rows_per_seq)
    return tokens.view(-1, params.rows_per_seq)


@dataclass
class StaticRows:
    """The per-row parameters that stay fixed while a request runs, for one batch of sequences."""

    seqs: list[Sequence]  # held so that the ids of the cache key stay theirs
    temperatures: torch.Tensor  # [R] float32
    eos_ids: torch.Tensor  # [R] int64
    penalties: torch.Tensor | None  # [R] float32; None: no row penalises
    top_p: torch.Tensor | None  # [R] float32; None: no row uses it
    top_k: torch.Tensor | None  # [R] int64; None: no row uses it


StaticCache = dict[int, tuple[tuple[int, ...], StaticRows]]  # num_rows -> (ids of the last batch, its rows)


def _static_rows(seqs: list[Sequence], num_rows: int, cache: StaticCache) -> StaticRows:
    """Built once per batch composition: consecutive decode steps of the same sequences reuse them."""
    key = tuple(map(id, seqs))
    hit = cache.get(num_rows)
    if hit is not None and hit[0] == key:
        return hit[1]

    def per_row(values: list[float] | list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).repeat_interleave(num_rows)  # [S] -> [R]

    params = [seq.params for seq in seqs]
    top_p = [1.0 if p.top_p is None else p.top_p for p in params]
    top_k = [0 if p.top_k is None else p.top_k for p in params]
    # which steps any row needs is decided on the host lists: no tensor is read back (a sync on CUDA)
    rows = StaticRows(
        seqs=list(seqs),
        temperatures=torch.tensor([t for p in params for t in p.temperatures(num_rows)], dtype=torch.float32),
        eos_ids=per_row([p.eos_token_id for p in params], torch.int64),
        penalties=(per_row([p.repetition_penalty for p in params], torch.float32)
                   if any(p.repetition_penalty != 1 for p in params) else None),
        top_p=per_row(top_p, torch.float32) if any(v < 1 for v in top_p) else None,
        top_k=per_row(top_k, torch.int64) if any(v > 0 for v in top_k) else None,
    )
    cache[num_rows] = (key, rows)
    return rows


def _row_params(seqs: list[Sequence], num_rows: int, cache: StaticCache | None = None) -> lp.RowParams:
    """Every request's own parameters as per-row tensors [S*rows]; a step no row needs is None (skipped)."""
    static = _static_rows(seqs, num_rows, {} if cache is None else cache)
    history = _history(seqs, num_rows)
    mask_eos = torch.tensor([seq.num_generated < seq.params.min_new_token for seq in seqs], dtype=torch.bool)
    return lp.RowParams(
        rows_per_seq=num_rows,
        temperatures=static.temperatures,
        eos_ids=static.eos_ids,
        mask_eos=mask_eos.repeat_interleave(num_rows),
        penalties=static.penalties if history.shape[1] > 0 else None,
        history=history,
        top_p=static.top_p,
        top_k=static.top_k,
        custom=[(s, seq.params.logits_processors, seq.token_ids())
                for s, seq in enumerate(seqs) if seq.params.logits_processors],
    )


def _history(seqs: list[Sequence], num_rows: int) -> torch.Tensor:
    """[S*rows, W] the last penalty_window generated ids of each row, right-padded with -1."""
    counts = [min(seq.num_generated, max(seq.params.penalty_window, 0)) for seq in seqs]
    width = max(counts, default=0)
    flat = array.array("q")  # one flat int64 buffer, filled by slices of each sequence's flat history
    pad = array.array("q", [-1]) * (width * num_rows)
    for seq, count in zip(seqs, counts, strict=True):
        if count:
            flat += seq.generated_flat[-count * num_rows:]
        flat += pad[: (width - count) * num_rows]
    table = int64_tensor(flat).view(len(seqs), width, num_rows)  # [S, W, rows]
    return table.transpose(1, 2).reshape(len(seqs) * num_rows, width)


def int64_tensor(values: array.array[int]) -> torch.Tensor:
    """A host int64 tensor of an array('q') (a copy; torch.tensor reads Python lists element by element)."""
    if not values:
        return torch.empty(0, dtype=torch.int64)
    return torch.frombuffer(values, dtype=torch.int64).clone()
