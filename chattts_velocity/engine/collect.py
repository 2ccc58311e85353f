"""Engine stage: Collectors — one consumer's requests, their engine deltas gathered into whole GenerationOutputs.

In: each engine step's StepDeltas (engine/sched/step.py). Out: a request's GenerationOutput once it finished
(LLM.generate), or its rows since the last hand-off (`Collector.drain`, LLM.stream). A steady step's block is taken as a
whole: it joins a log, one append a step; the log reaches the requests when the persistent batch changes, one of them
ends or the consumer flushes it (one slice per request then), so no steady step costs anything per request.
"""
from __future__ import annotations

import numpy as np
import torch

from chattts_velocity.engine.sched.step import SteadyRows, StepDeltas
from chattts_velocity.engine.worker.hidden_log import runs, slot_rows
from chattts_velocity.schema import FinishReason, GenerationOutput


class Collector:
    """Accumulates one request's rows into a GenerationOutput."""

    def __init__(self, request_id: str, hidden_size: int | None) -> None:
        self.request_id, self.hidden_size = request_id, hidden_size
        self.tokens: list[torch.Tensor] = []  # [n, rows] each
        self.hidden: list[torch.Tensor] = []  # [n, H] each
        self.finished = False
        self.finish_reason: FinishReason | None = None
        self.error: Exception | None = None
        self.rows: int | None = None

    def add(self, delta: GenerationOutput) -> None:
        self.add_rows(delta.token_ids, delta.hidden)
        self.finished, self.finish_reason, self.error = delta.finished, delta.finish_reason, delta.error

    def add_rows(self, tokens: torch.Tensor, hidden: torch.Tensor | list[torch.Tensor] | None) -> None:
        """tokens [n, rows] and the hidden states [n, H] that predicted them, or pieces of them in order (None: not
        kept)."""
        self.rows = tokens.shape[1]
        if len(tokens):
            self.tokens.append(tokens)
            if hidden is not None and self.hidden_size is not None:
                self.hidden += hidden if isinstance(hidden, list) else [hidden]

    def output(self) -> GenerationOutput:
        rows = self.rows or 1
        tokens = _joined(self.tokens) if self.tokens else torch.zeros(0, rows, dtype=torch.int64)
        hidden = _joined(self.hidden) if self.hidden else None
        if hidden is None and self.hidden_size is not None:
            hidden = torch.zeros(0, self.hidden_size)  # [0, H]: nothing generated
        return GenerationOutput(self.request_id, tokens, hidden, self.finished, self.finish_reason, error=self.error)

    def drain(self) -> GenerationOutput:
        """The rows added since the last drain ([t, rows] tokens, [t, H] hidden), with the end so far; they leave."""
        out = self.output()
        self.tokens, self.hidden = [], []
        return out

    @property
    def pending(self) -> bool:
        """Rows not drained yet."""
        return bool(self.tokens)


def _joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """The parts concatenated along dim 0; a single part as it is where contiguous (a slice of the flushed log)."""
    return parts[0].contiguous() if len(parts) == 1 else torch.cat(parts)


class Collectors:
    """The collectors of one consumer's requests (other requests sharing the engine are ignored)."""

    def __init__(self) -> None:
        self.by_id: dict[str, Collector] = {}
        self.ids: list[str] | None = None  # the slots of the logged steady blocks (one persistent batch)
        self.mine = np.zeros(0, dtype=bool)  # [N] the slots that are this consumer's requests
        self.tokens: list[torch.Tensor] = []  # [T] of [N, rows]
        self.hidden: list[torch.Tensor | None] = []  # [T] of [N, H]
        self.live: np.ndarray | None = None  # [N] the last block's rows that are there (the others ended with it)

    def add(self, request_id: str, hidden_size: int | None) -> None:
        self.by_id[request_id] = Collector(request_id, hidden_size)

    def take(self, step: StepDeltas) -> tuple[int, list[str]]:
        """Take one step's deltas -> (this consumer's new rows, its requests that finished with the step)."""
        rows = self._log(step.steady) if step.steady is not None else 0
        singles = step.singles()
        if not singles:
            return rows, []
        self.flush()  # a request ends: the log first, so its rows come in order
        finished = []
        for delta in singles:
            collector = self.by_id.get(delta.request_id)
            if collector is None:
                continue  # another consumer's request sharing this engine
            collector.add(delta)
            rows += len(delta.token_ids)
            if collector.finished:
                finished.append(delta.request_id)
        return rows, finished

    def _log(self, block: SteadyRows) -> int:
        if block.request_ids is not self.ids or self.live is not None:
            self.flush()
            self.ids = block.request_ids
            self.mine = np.fromiter((rid in self.by_id for rid in block.request_ids), dtype=bool,
                                    count=len(block.request_ids))
        self.tokens.append(block.tokens)
        self.hidden.append(block.hidden)
        self.live = block.live
        return int(self.mine.sum() if block.live is None else (self.mine & block.live).sum())

    def flush(self) -> None:
        """The logged blocks reach the collectors: per request, its rows [T, rows] and hidden states [T, H]."""
        if not self.tokens or self.ids is None:
            return
        tokens = torch.stack(self.tokens, 1)  # [N, T, rows]
        pieces = runs(self.hidden) if self.hidden[0] is not None else None  # type: ignore[arg-type]  # [N, t_i, H]
        live = None if self.live is None else self.live.tolist()
        for b in np.flatnonzero(self.mine).tolist():
            count = tokens.shape[1] - (live is not None and not live[b])
            self.by_id[self.ids[b]].add_rows(tokens[b, :count], None if pieces is None else slot_rows(pieces, b, count))
        self.tokens, self.hidden, self.live = [], [], None
