"""Engine stage: per-row sampling of the next tokens.

In: the sequences that sample this step and their logits [S*rows, V] (row s*rows + q is
codebook q of sequence s). Out: tokens [S, rows] int64.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from chattts_velocity.engine import logits_processors as lp
from chattts_velocity.engine.sequence import Sequence
from chattts_velocity.schema import LogitsProcessor

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
    return _splitmix64(_splitmix64(seed & _MASK64) ^ step)


@dataclass
class SamplingBatch:
    """Per-row sampling parameters of one step, built on CPU by Sampler.prepare."""

    num_rows: int  # rows per sequence: num_vq in code mode, 1 in text mode
    temperatures: torch.Tensor  # [R] float32
    penalties: torch.Tensor  # [R] float32, 1.0 = off
    history: torch.Tensor  # [R, W] int64 recent generated ids, -1 = padding
    top_p: torch.Tensor  # [R] float32, 1.0 = off
    top_k: torch.Tensor  # [R] int64, 0 = off
    eos_ids: torch.Tensor  # [R] int64
    mask_eos: torch.Tensor  # [R] bool; True while len(generated) < min_new_token
    noise_seeds: list[int]  # [S] step_seed(seq.seed, len(seq.generated))
    # (sequence index, its processors, its generated history [G, rows]) for requests that have any
    custom: list[tuple[int, tuple[LogitsProcessor, ...], torch.Tensor]] = field(default_factory=list)

    @property
    def use_penalty(self) -> bool:
        return self.history.shape[1] > 0 and bool((self.penalties != 1).any())

    @property
    def use_top_p(self) -> bool:
        return bool((self.top_p < 1).any())

    @property
    def use_top_k(self) -> bool:
        return bool((self.top_k > 0).any())


class Sampler:
    """prepare(seqs) -> SamplingBatch on CPU, then sample(logits, batch) -> tokens.

    Noise is drawn on CPU from step_seed(seq.seed, step) and copied to the logits' device, so a
    seed gives the same noise on every device. Unlike the reference's manual_seed, which
    re-seeds with the same value at every step (the same noise each step), the noise changes
    from step to step.
    """

    def __init__(self) -> None:
        self._generator = torch.Generator(device="cpu")  # re-seeded per (request, step)

    def prepare(self, seqs: list[Sequence], num_rows: int) -> SamplingBatch:
        if any(seq.num_rows != num_rows for seq in seqs):
            raise ValueError(
                f"Sampler.prepare: every sequence must sample {num_rows} rows (one mode per call)"
            )
        if any(seq.seed is None for seq in seqs):
            raise ValueError("Sampler.prepare: every sequence needs a seed (Scheduler.add assigns one)")

        def per_row(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).repeat_interleave(num_rows)  # [S] -> [R]

        params = [seq.params for seq in seqs]
        temperatures = [t for seq in seqs for t in seq.params.temperatures(num_rows)]
        return SamplingBatch(
            num_rows=num_rows,
            temperatures=torch.tensor(temperatures, dtype=torch.float32),
            penalties=per_row([p.repetition_penalty for p in params], torch.float32),
            history=_history(seqs, num_rows),
            top_p=per_row([1.0 if p.top_p is None else p.top_p for p in params], torch.float32),
            top_k=per_row([0 if p.top_k is None else p.top_k for p in params], torch.int64),
            eos_ids=per_row([p.eos_token_id for p in params], torch.int64),
            mask_eos=per_row([seq.num_generated < seq.params.min_new_token for seq in seqs], torch.bool),
            noise_seeds=[step_seed(seq.seed, seq.num_generated) for seq in seqs],  # type: ignore[arg-type]
            custom=[(s, seq.params.logits_processors, seq.token_ids())
                    for s, seq in enumerate(seqs) if seq.params.logits_processors],
        )

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """logits [S*rows, V] (any float dtype, any device; not modified) -> tokens [S, rows] int64.

        Order (logits_processors docstring): temperature, penalty, top-p, top-k, custom, EOS mask.
        """
        device = logits.device
        logits = logits.to(torch.float32, copy=True)
        logits = lp.apply_temperature(logits, batch.temperatures.to(device))
        if batch.use_penalty:
            logits = lp.apply_repetition_penalty(logits, batch.history.to(device), batch.penalties.to(device))
        if batch.use_top_p:
            logits = lp.apply_top_p(logits, batch.top_p.to(device))
        if batch.use_top_k:
            logits = lp.apply_top_k(logits, batch.top_k.to(device))
        logits = self._apply_custom(logits, batch)
        logits = lp.mask_eos(logits, batch.mask_eos.to(device), batch.eos_ids.to(device))
        probs = logits.softmax(dim=-1)
        # argmax(p / E), E ~ Exp(1), is exactly how torch.multinomial draws one sample
        noise = self._noise(batch, logits.shape[1]).to(device)
        return probs.div_(noise).argmax(dim=-1).view(-1, batch.num_rows)

    def _apply_custom(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        rows = batch.num_rows
        for s, processors, history in batch.custom:
            own = logits[s * rows:(s + 1) * rows]  # [rows, V] this request's rows only
            for fn in processors:
                own = fn(history.to(logits.device), own)
            logits[s * rows:(s + 1) * rows] = own
        return logits

    def _noise(self, batch: SamplingBatch, vocab: int) -> torch.Tensor:
        """Exp(1) noise [S*rows, V] on CPU; each request's block comes from its own (seed, step)."""
        rows = batch.num_rows
        noise = torch.empty(len(batch.noise_seeds) * rows, vocab, dtype=torch.float32)
        for s, seed in enumerate(batch.noise_seeds):
            self._generator.manual_seed(seed)
            noise[s * rows:(s + 1) * rows].exponential_(generator=self._generator)
        return noise


def _history(seqs: list[Sequence], num_rows: int) -> torch.Tensor:
    """[S*rows, W] the last penalty_window generated ids of each row, right-padded with -1."""
    recent = [seq.generated[-seq.params.penalty_window:] if seq.params.penalty_window > 0 else []
              for seq in seqs]
    width = max((len(r) for r in recent), default=0)
    pad = (-1,) * num_rows
    padded = [r + [pad] * (width - len(r)) for r in recent]
    table = torch.tensor(padded, dtype=torch.int64).view(len(seqs), width, num_rows)  # [S, W, rows]
    return table.transpose(1, 2).reshape(len(seqs) * num_rows, width)
