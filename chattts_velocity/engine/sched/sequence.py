"""Engine stage: one request's state (prompt rows, generated tokens, hidden states, KV bookkeeping).

In: schema.Prompt + schema.SamplingParams. Out: generated tokens and hidden states (LLMEngine turns them into
GenerationOutput deltas).
"""
from __future__ import annotations

import array
import hashlib
from enum import Enum
from typing import Protocol

import numpy as np
import torch

from chattts_velocity.schema import FinishReason, Prompt, SamplingParams


class StepLog(Protocol):
    """Where a persistent batch keeps its steps until its sequences take them (engine/sched/decode_batch.py)."""

    @property
    def pending(self) -> bool: ...

    def rows_behind(self, slot: int) -> bool: ...

    def sync(self) -> None: ...


class LoggedHidden:
    """Slot `slot`'s hidden states in `count` logged steps of a persistent batch (steps: [t] of [B, H]), kept as the
    step outputs and stacked only when read: handing a batch's log to its sequences copies no hidden state."""

    def __init__(self, steps: list[torch.Tensor], slot: int, count: int) -> None:
        self.steps, self.slot, self.count = steps, slot, count

    def __len__(self) -> int:
        return self.count

    def stacked(self) -> torch.Tensor:
        """[count, H]"""
        return torch.stack([step[self.slot] for step in self.steps[: self.count]])


class SequenceStatus(Enum):
    WAITING = "waiting"  # also a preempted sequence waiting to be recomputed
    RUNNING = "running"
    FINISHED_EOS = "eos"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self not in (SequenceStatus.WAITING, SequenceStatus.RUNNING)


class Sequence:
    """A request as the engine sees it.

    One position = one KV slot = one row of `num_vq` ids (a prompt row, or a generated token).
    `len(seq)` counts positions: prompt rows + generated tokens. Between steps a running
    sequence has `num_computed_tokens <= len(seq) - 1`: the last position (the newest token)
    still has to be fed to predict the next one.
    """

    is_beam = False  # a beam of a beam-search request: the beam search appends its tokens (engine/beams/velocity.py)
    client = ""  # who sent it (an API key's digest, an address): admission shares the seats between clients
    seat_group: tuple[str, int] | None = None  # (group, seats): sequences sharing one reservation of max_num_seqs

    def __init__(self, request_id: str, prompt: Prompt, params: SamplingParams, arrival: float = 0.0) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.arrival = arrival
        self.prompt_ids = prompt.input_ids.to("cpu", torch.int64)  # [P, num_vq]
        self.prompt_mask = prompt.text_mask.to("cpu", torch.bool)  # [P]
        self._prompt_array = self.prompt_ids.contiguous().numpy()  # the same rows, for row_bytes
        self._prompt_mask_array = self.prompt_mask.contiguous().numpy()
        self.num_prompt_tokens = self.prompt_ids.shape[0]  # an int: len(seq) is read many times per step
        self.num_vq = self.prompt_ids.shape[1]
        self.is_text = params.mode == "text"
        self.num_rows = 1 if self.is_text else self.num_vq  # sampled rows per step
        params.temperatures(self.num_rows)  # a ValueError at add time, not in a step, if the count does not fit
        self._generated: list[tuple[int, ...]] = []  # [G][num_rows]
        self._generated_flat = array.array("q")  # [G * num_rows] the same ids, flat (the sampler's penalty history)
        self.log: StepLog | None = None  # the persistent batch that may hold steps of this sequence not yet here
        self.log_slot = 0  # this sequence's slot in it
        # [H] per kept generated token, or a LoggedHidden per run of steps on a persistent batch: the step outputs
        # (no copy per step), joined on demand
        self._hidden: list[torch.Tensor | LoggedHidden] = []
        self.status = SequenceStatus.WAITING
        self._num_computed_tokens = 0  # positions whose KV is in the cache
        self.num_cached_tokens = 0  # positions served by the prefix cache at the last allocate()
        self.block_table: list[int] = []
        self.seed: int | None = params.seed  # the scheduler draws one at add() when None
        self.num_preemptions = 0
        self.cache_salt = _cache_salt(prompt)

    def __len__(self) -> int:
        return self.num_prompt_tokens + len(self.generated)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.name}, len={len(self)}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_table})"
        )

    def _pull(self) -> None:
        """The steps a persistent batch logged reach this sequence (and its batch-mates) before anything reads it."""
        if self.log is not None and self.log.pending:
            self.log.sync()

    def _pull_rows(self) -> None:
        """As _pull, where this sequence's rows are behind (its hidden states may wait)."""
        if self.log is not None and self.log.rows_behind(self.log_slot):
            self.log.sync()

    @property
    def generated(self) -> list[tuple[int, ...]]:
        self._pull_rows()
        return self._generated

    @generated.setter
    def generated(self, rows: list[tuple[int, ...]]) -> None:
        self._pull()
        self._generated = rows

    @property
    def generated_flat(self) -> array.array[int]:
        self._pull_rows()
        return self._generated_flat

    @property
    def num_computed_tokens(self) -> int:
        self._pull_rows()
        return self._num_computed_tokens

    @num_computed_tokens.setter
    def num_computed_tokens(self, value: int) -> None:
        self._pull()
        self._num_computed_tokens = value

    @property
    def num_generated(self) -> int:
        return len(self.generated)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> FinishReason | None:
        # mypy silenced below: a finished status's value is one of FinishReason's strings
        return self.status.value if self.status.is_finished else None  # type: ignore[return-value]

    def num_blocks(self, block_size: int) -> int:
        """KV blocks needed to hold every position of the sequence."""
        return (len(self) + block_size - 1) // block_size

    def rows(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Model inputs of positions [start, end): ids [n, num_vq] int64 and text_mask [n] bool.

        Generated positions read as the model embeds them: a code token as its num_vq codes
        (text_mask False), a text token repeated over the channels (text_mask True).
        """
        num_prompt = self.num_prompt_tokens
        ids = [self.prompt_ids[start:min(end, num_prompt)]]
        mask = [self.prompt_mask[start:min(end, num_prompt)]]
        if end > num_prompt:
            gen = torch.tensor(self.generated[max(start, num_prompt) - num_prompt:end - num_prompt],
                               dtype=torch.int64).view(-1, self.num_rows)  # [g, num_rows]
            ids.append(gen.expand(-1, self.num_vq))
            mask.append(torch.full((gen.shape[0],), self.is_text, dtype=torch.bool))
        return torch.cat(ids), torch.cat(mask)

    def row_bytes(self, start: int, end: int) -> bytes:
        """The bytes of rows(start, end) as numpy gives them: ids (int64, row-major) then text_mask (bool); for
        hashing a block without building tensors."""
        num_prompt, num_gen = self.num_prompt_tokens, max(end - max(start, self.num_prompt_tokens), 0)
        ids = self._prompt_array[start:min(end, num_prompt)].tobytes()
        mask = self._prompt_mask_array[start:min(end, num_prompt)].tobytes()
        if num_gen:
            first = max(start, num_prompt) - num_prompt
            generated = np.frombuffer(self.generated_flat, dtype=np.int64)[first * self.num_rows:
                                                                         (first + num_gen) * self.num_rows]
            ids += (np.repeat(generated, self.num_vq) if self.is_text else generated).tobytes()
            mask += (b"\x01" if self.is_text else b"\x00") * num_gen
        return ids + mask

    @property
    def last_row(self) -> tuple[int, ...]:
        """The ids of position len-1 ([num_vq]; a text token repeated), fed at a decode step."""
        if not self.generated:
            return tuple(self.prompt_ids[-1].tolist())
        last = self.generated[-1]
        return last * self.num_vq if self.is_text else last

    def token_ids(self) -> torch.Tensor:
        """Generated tokens so far: [G, num_rows] int64 (the EOS step is never stored)."""
        return torch.tensor(self.generated, dtype=torch.int64).view(-1, self.num_rows)

    def hidden_states(self) -> torch.Tensor | None:
        """[G, H]; row k is the state that predicted generated token k. None if none kept."""
        self._pull()
        if not self._hidden:
            return None
        parts = [h.stacked() if isinstance(h, LoggedHidden) else h.reshape(-1, h.shape[-1]) for h in self._hidden]
        return torch.cat(parts)

    def append_token(self, token: tuple[int, ...], hidden: torch.Tensor | None) -> None:
        """Record one sampled token ([num_rows] ids) and the hidden state [H] that predicted it."""
        if len(token) != self.num_rows:
            raise ValueError(f"token has {len(token)} ids, sequence samples {self.num_rows} rows")
        if hidden is not None and self.params.return_hidden:
            self._hidden.append(hidden)
        self.generated.append(token)
        self.generated_flat.extend(token)

    def extend_rows(self, rows: np.ndarray, hidden: LoggedHidden | None) -> None:
        """Steps run on a persistent batch (engine/sched/decode_batch.py): rows [t, num_rows] int64 (C-contiguous)
        and the hidden states of the t' steps whose hidden states come now (None: none kept; rows may come
        ahead of their hidden states); every position but the newest is computed. No checks: the persistent batch
        checked the shapes once."""
        if hidden is not None and len(hidden) and self.params.return_hidden:
            self._hidden.append(hidden)
        if not len(rows):
            return
        self._generated.extend(map(tuple, rows.tolist()))
        self._generated_flat.frombytes(rows.tobytes())
        if self.status is SequenceStatus.RUNNING:
            self._num_computed_tokens = self.num_prompt_tokens + len(self._generated) - 1


def _cache_salt(prompt: Prompt) -> bytes:
    """Bytes that change the KV of a prompt beyond its ids: the speaker vector and where it goes."""
    if prompt.spk_emb is None:
        return b""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(prompt.spk_emb.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    digest.update(repr(tuple(prompt.spk_positions)).encode())
    return digest.digest()
