"""Engine stage: beam search for the text pass, the part both GPT paths share.

In: each live beam's last hidden state [S, H] (in `BeamState.live` order). Out: which beams live on (parent index
and token each) and, once done, the best finished hypothesis.

The score of a beam is the sum of the log-probabilities of its tokens under the *processed* distribution:
log_softmax of the text head's logits after the text pass's processors, with sampling's own controls off
(temperature 1, no top-p, no top-k) and the rest as they are (repetition penalty over penalty_window, custom
logits processors, the min_new_token EOS mask). `ensure_non_empty` forbids EOS as the first token (a deterministic
search would only find the same empty text again). Hypotheses rank by score / length**length_penalty, where length
counts every scored token, the EOS included.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from chattts_velocity.engine.worker.sampling import logits_processors as lp
from chattts_velocity.model import Embed
from chattts_velocity.schema import FinishReason, SamplingParams


@dataclass(frozen=True)
class Beam:
    tokens: tuple[int, ...]  # generated text ids so far
    logprob: float  # the sum of their log-probabilities


@dataclass(frozen=True)
class Hypothesis:
    tokens: tuple[int, ...]  # the EOS step is not stored
    logprob: float
    score: float  # logprob / length**length_penalty
    reason: FinishReason


class BeamState:
    """One request's search: `live` beams to extend, the `finished` hypotheses (at most beam_width, best first)."""

    def __init__(self, params: SamplingParams) -> None:
        self.width, self.length_penalty = params.beam_width, params.length_penalty
        self.max_new, self.eos = params.max_new_token, params.eos_token_id
        self.live: list[Beam] = [Beam((), 0.0)]
        self.finished: list[Hypothesis] = []

    @property
    def done(self) -> bool:
        return not self.live

    def step(self, logprobs: torch.Tensor) -> list[int]:
        """logprobs [S, V] of the live beams' next token -> the new live beams' parent indices (into the old live).

        Candidates are taken best first (ties: lower beam, then lower token id) until beam_width of them live on;
        those ending in EOS or reaching max_new_token finish on the way.
        """
        vocab = logprobs.shape[1]
        sums = torch.tensor([b.logprob for b in self.live], dtype=torch.float64, device=logprobs.device)
        totals = logprobs.double() + sums.unsqueeze(1)  # [S, V]
        values, order = totals.view(-1).topk(min(2 * self.width + 1, totals.numel()))  # enough to fill `width`
        live: list[Beam] = []
        parents: list[int] = []
        for value, index in sorted(zip(values.tolist(), order.tolist(), strict=True), key=lambda c: (-c[0], c[1])):
            if value == float("-inf") or len(live) == self.width:
                break
            parent, token = divmod(index, vocab)
            tokens = self.live[parent].tokens
            if token == self.eos:
                self._finish(tokens, value, "eos")
            elif len(tokens) + 1 >= self.max_new:
                self._finish(tokens + (token,), value, "length")
            else:
                live.append(Beam(tokens + (token,), value))
                parents.append(parent)
        self.live = live
        if self._cannot_improve():
            self.live, parents = [], []
        return parents

    def best(self) -> Hypothesis:
        """The highest-scoring finished hypothesis (or, when stopped early, the best live beam so far)."""
        if self.finished:
            return self.finished[0]
        beam = max(self.live, key=lambda b: b.logprob, default=Beam((), 0.0))
        return Hypothesis(beam.tokens, beam.logprob, beam.logprob, "interrupted")

    def _finish(self, tokens: tuple[int, ...], logprob: float, reason: FinishReason) -> None:
        length = len(tokens) + (reason == "eos")
        self.finished.append(Hypothesis(tokens, logprob, logprob / length**self.length_penalty, reason))
        self.finished.sort(key=lambda h: -h.score)  # stable: an earlier hypothesis wins a tie
        del self.finished[self.width:]

    def _cannot_improve(self) -> bool:
        """True when beam_width hypotheses are finished and no live beam scores, as it stands, above the worst.

        Exact for length_penalty <= 0 (a beam's score only falls as it grows); for length_penalty > 0 a longer beam
        could still gain by the division: the usual heuristic, without which every search would run to max_new_token.
        """
        if len(self.finished) < self.width:
            return False
        worst = self.finished[-1].score
        return all(b.logprob / len(b.tokens) ** self.length_penalty <= worst for b in self.live)


def beam_logprobs(embed: Embed, hidden: torch.Tensor, beams: list[Beam], params: SamplingParams,
                  ) -> tuple[torch.Tensor, dict[int, Exception]]:
    """hidden [S, H] of the live beams -> the processed log-probabilities [S, V_text] float32, and
    {beam index: error} for beams whose custom logits processors raised (their rows are meaningless)."""
    logits = embed.logits_rowwise(hidden.float(), "text")  # [S, V]
    rows = lp.RowParams(
        rows_per_seq=1,
        temperatures=torch.ones(len(beams)),
        eos_ids=torch.full((len(beams),), params.eos_token_id, dtype=torch.int64),
        mask_eos=torch.tensor([len(b.tokens) < min_new_tokens(params) for b in beams], dtype=torch.bool),
        custom=[(s, params.logits_processors, _history(b.tokens, None)) for s, b in enumerate(beams)
                if params.logits_processors],
    )
    if params.repetition_penalty != 1.0 and params.penalty_window > 0:
        recent = [_history(b.tokens, params.penalty_window)[:, 0].tolist() for b in beams]
        width = max(len(r) for r in recent)
        rows.history = torch.tensor([r + [-1] * (width - len(r)) for r in recent], dtype=torch.int64)  # [S, W]
        rows.penalties = torch.full((len(beams),), params.repetition_penalty)
    logits = lp.process(logits, rows)
    return logits.log_softmax(dim=-1), rows.failures


def min_new_tokens(params: SamplingParams) -> int:
    return max(params.min_new_token, int(params.ensure_non_empty))


def _history(tokens: tuple[int, ...], window: int | None) -> torch.Tensor:
    """[G, 1] int64: the last `window` (None: all) generated ids, as a custom processor sees a text request's."""
    kept = tokens if window is None else tokens[len(tokens) - min(window, len(tokens)):]
    return torch.tensor(kept, dtype=torch.int64).view(-1, 1)
