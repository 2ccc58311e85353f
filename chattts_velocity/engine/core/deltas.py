"""Engine stage: what one step hands on — a steady step's new rows as one block, every other delta one by one.

In: a step's sampled tokens and hidden states (LLMEngine). Out: StepDeltas, taken as a whole by the engine's consumers
(engine/llm.py, engine/async_engine.py); `outputs()` gives the per-request GenerationOutput deltas of LLMEngine.step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from chattts_velocity.schema import GenerationOutput


@dataclass
class SteadyRows:
    """One new row for each slot of the persistent batch (engine/core/decode_batch.py) that goes on."""

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
