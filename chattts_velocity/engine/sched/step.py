"""Engine stage: the hand-offs of one step: scheduler, model runner, consumers.

Scheduler -> runner: ScheduledBatch (which positions of which sequences to compute). Runner -> scheduler:
StepOutput (the sampled tokens and the hidden states that predicted them). Engine -> its consumers: StepDeltas (a steady
step's new rows as one block, every other delta one by one; `outputs()` gives LLMEngine.step's per-request deltas).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from chattts_velocity.engine.sched.decode_batch import DecodeBatch
from chattts_velocity.engine.sched.sequence import Sequence
from chattts_velocity.schema import GenerationOutput


@dataclass
class ScheduledBatch:
    """One step's work. Sequence b computes positions [num_computed_tokens[b], +num_new_tokens[b])."""

    seqs: list[Sequence]  # [B]; blocks for every computed position are already in seq.block_table
    num_new_tokens: list[int]  # [B] positions to compute: a prefill chunk, or 1 for decode
    num_computed_tokens: list[int]  # [B] positions already in the KV cache (the chunk's start)
    # [B] False only for a plain decode: one generated position, whose ids are seq.last_row.
    # True for prompt chunks and for recomputing generated positions after a preemption.
    is_prefill: list[bool]
    sample: list[bool]  # [B] the chunk reaches len(seq): the last position's logits are sampled
    # the persistent decode batch this step runs on (a decode-only step of an eligible, whole running set), or None
    steady: DecodeBatch | None = None
    # 1: a steady step scheduled before the tokens of the one in flight were read (engine/worker/overlap.py); its
    # positions, counters and blocks are one step past the sequences'
    ahead: int = 0

    @property
    def num_seqs(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def is_decode_only(self) -> bool:
        return not any(self.is_prefill)


@dataclass
class StepOutput:
    """What the model runner returns for a ScheduledBatch."""

    tokens: torch.Tensor  # [B, rows] int64; rows >= seqs[b].num_rows; row b is ignored unless sampled[b]
    hidden: torch.Tensor | None  # [B, H] last computed position's state (predicted tokens[b]); None: not kept
    sampled: list[bool]  # [B] equals ScheduledBatch.sample (False for a partial prefill chunk)
    failed: dict[int, Exception] = field(default_factory=dict)  # b -> why sequence b failed this step (only it)


@dataclass
class SteadyRows:
    """One new row for each slot of the persistent batch (engine/sched/decode_batch.py) that goes on."""

    request_ids: list[str]  # [N] the persistent batch's slots; the same list object while the batch stays
    tokens: torch.Tensor  # [N, rows] int64 on the host
    hidden: torch.Tensor | None  # [N, H] float32; row b is slot b's state where keeps_hidden[b]; None: nobody keeps
    keeps_hidden: np.ndarray | None  # [N] bool; None: every slot keeps its hidden states
    counts: np.ndarray  # [N] int64: each slot's generated tokens after this step
    live: np.ndarray | None = None  # [N] bool: the slots whose row is here (None: all); the others ended this step

    def delta(self, slot: int) -> GenerationOutput:
        """Slot `slot`'s GenerationOutput ([1, rows] tokens, [1, H] hidden)."""
        keeps = self.hidden is not None and (self.keeps_hidden is None or bool(self.keeps_hidden[slot]))
        return GenerationOutput(self.request_ids[slot], self.tokens[slot: slot + 1],
                                self.hidden[slot: slot + 1] if keeps else None,  # type: ignore[index]  # keeps
                                False, None, {"num_generated": int(self.counts[slot])})

    def deltas(self) -> list[GenerationOutput | None]:
        """[N] one GenerationOutput per slot ([1, rows] tokens, [1, H] hidden), None where the slot ended."""
        tokens = self.tokens.unsqueeze(1).unbind(0)  # [1, rows] views (per-row slicing costs a few us a row)
        num = len(self.request_ids)
        hidden: list[torch.Tensor | None] = ([None] * num if self.hidden is None
                                             else list(self.hidden.unsqueeze(1).unbind(0)))
        if self.hidden is not None and self.keeps_hidden is not None:
            hidden = [h if keep else None for h, keep in zip(hidden, self.keeps_hidden.tolist(), strict=True)]
        live = [True] * num if self.live is None else self.live.tolist()
        return [GenerationOutput(rid, row, state, False, None, {"num_generated": count}) if go_on else None
                for rid, row, state, count, go_on in zip(self.request_ids, tokens, hidden, self.counts.tolist(), live,
                                                         strict=True)]


@dataclass
class StepDeltas:
    """One engine step's deltas: `steady` (the block of a persistent-batch step), `ended` (slot, delta) for the slots
    of that batch that ended with the step, `others` every delta of a general step, failures, beam results."""

    steady: SteadyRows | None = None
    ended: list[tuple[int, GenerationOutput]] = field(default_factory=list)
    others: list[GenerationOutput] = field(default_factory=list)

    def singles(self) -> list[GenerationOutput]:
        """The deltas not in the steady block."""
        return [delta for _, delta in self.ended] + self.others if self.ended else self.others

    def outputs(self) -> list[GenerationOutput]:
        """Every delta of the step, one per request, in the order of the batch (the steady rows and the slots that
        ended interleaved by slot), then the others."""
        if self.steady is None:
            return self.singles()
        rows = self.steady.deltas()
        for slot, delta in self.ended:
            rows[slot] = delta
        return [delta for delta in rows if delta is not None] + self.others
