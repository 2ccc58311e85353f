"""Engine stage: beam-search requests on the velocity engine, driven between steps.

In: (request_id, Prompt, SamplingParams with beam_width) from LLMEngine.add_request; each step's batch and output.
Out: one GenerationOutput per beam request, when its search ends (the best hypothesis: tokens [T, 1], no hidden).

Every live beam is a Sequence in the scheduler, batched with all other requests. A beam's sampled token is not
appended (Scheduler.postprocess skips `is_beam` sequences) and, fully computed, it is not scheduled again until its
group chooses (it is *parked*): once every live beam of a request has its new hidden state, BeamState picks the
survivors; the first child of a beam continues in its sequence, each further child is a new sequence forked from it
through the block manager (sharing its full computed blocks; the partial last block is the child's own, recomputed),
and a beam without children is aborted, which frees its blocks.
"""
from __future__ import annotations

import dataclasses
import itertools

import torch

from chattts_velocity.engine.beams.search import BeamState, beam_logprobs
from chattts_velocity.engine.sched.scheduler import Scheduler
from chattts_velocity.engine.sched.sequence import Sequence, SequenceStatus
from chattts_velocity.engine.sched.step import ScheduledBatch, StepOutput
from chattts_velocity.model import Embed
from chattts_velocity.schema import GenerationOutput, Prompt, SamplingParams


class BeamGroup:
    """One beam request: its search state and the sequence of each live beam (same order as state.live)."""

    def __init__(self, request_id: str, prompt: Prompt, params: SamplingParams, arrival: float,
                 client: str = "") -> None:
        self.request_id, self.prompt, self.params, self.arrival = request_id, prompt, params, arrival
        self.client = client
        self.state = BeamState(params)
        self.seqs: list[Sequence] = []
        self.hidden: dict[str, torch.Tensor] = {}  # beam sequence id -> its newest hidden state [H]
        self._names = itertools.count()
        # what the scheduler and sampler run for a beam: the beam search scores it (beam_logprobs) and picks tokens
        self.seq_params = dataclasses.replace(
            params, beam_width=1, temperature=1.0, top_p=None, top_k=None, repetition_penalty=1.0,
            logits_processors=(), min_new_token=0, seed=0, ensure_non_empty=False, return_hidden=True,
        )

    def new_sequence(self, tokens: tuple[int, ...]) -> Sequence:
        seq = Sequence(f"{self.request_id}#beam{next(self._names)}", self.prompt, self.seq_params, self.arrival)
        seq.is_beam = True
        seq.seat_group = (self.request_id, self.params.beam_width)  # admitted with seats for all its beams
        seq.client = self.client
        for token in tokens:
            seq.append_token((token,), None)
        return seq

    @property
    def ready(self) -> bool:
        return bool(self.seqs) and all(seq.request_id in self.hidden for seq in self.seqs)

    def output(self) -> GenerationOutput:
        best = self.state.best()
        tokens = torch.tensor(best.tokens, dtype=torch.int64).view(-1, 1)  # [T, 1]
        return GenerationOutput(self.request_id, tokens, None, True, best.reason,
                                extra={"num_generated": len(best.tokens), "beam_score": best.score,
                                       "beam_logprob": best.logprob})


class BeamSearch:
    """The engine's beam requests (LLMEngine.beams); `after_step` advances them and turns their deltas into outputs."""

    def __init__(self, scheduler: Scheduler, embed: Embed) -> None:
        self.scheduler, self.embed = scheduler, embed
        self.groups: dict[str, BeamGroup] = {}
        self._owner: dict[str, BeamGroup] = {}  # beam sequence id -> its group

    def add(self, request_id: str, prompt: Prompt, params: SamplingParams, arrival: float = 0.0,
            client: str = "") -> str:
        """Queue a beam request (any beam_width >= 1: width 1 is greedy decoding under the processed distribution)."""
        if request_id in self.groups:
            raise ValueError(f"request_id: {request_id!r} is already running; use a unique id")
        group = BeamGroup(request_id, prompt, params, arrival, client)
        root = group.new_sequence(())
        self.scheduler.add(root)  # a ValueError (too long, ...) leaves nothing behind
        group.seqs = [root]
        self._track(group, root)
        self.groups[request_id] = group
        return request_id

    def abort(self, request_id: str) -> bool:
        """Abort a beam request (by its id or any of its beams' ids), freeing every block; False if unknown."""
        group = self.groups.get(request_id) or self._owner.get(request_id)
        if group is None:
            return False
        self._close(group)
        return True

    def after_step(self, batch: ScheduledBatch, out: StepOutput | None,
                   deltas: list[GenerationOutput]) -> list[GenerationOutput]:
        """The step's deltas without the beams' own, plus a failed or final output for each beam request that ended."""
        if not self.groups:
            return deltas
        owners = [self._owner.get(delta.request_id) for delta in deltas]
        kept = [delta for delta, group in zip(deltas, owners, strict=True) if group is None]
        ended = []
        for delta, group in zip(deltas, owners, strict=True):
            if group is not None and delta.error is not None and group.request_id in self.groups:
                ended.append(self._fail(group, delta.error))
        if out is not None:
            self._collect_hidden(batch, out)
        for group in [g for g in self.groups.values() if g.ready]:
            try:
                ended += self._advance(group)
            except Exception as exc:  # noqa: BLE001 -- one request's search (its fork, its scores): it alone fails
                ended.append(self._fail(group, RuntimeError(f"beam search: {exc!r}")))
        for group in self.groups.values():
            self._yield_blocks(group)
        return kept + ended

    def _yield_blocks(self, group: BeamGroup) -> None:
        """While a beam of the group waits in the queue, its siblings that already have their hidden state give their
        blocks back and queue behind it (to be recomputed, from the prefix cache where it still holds them): parked
        beams never hold the pool against the beam they wait for, nor against anyone else's request."""
        if all(seq.status is SequenceStatus.RUNNING for seq in group.seqs):
            return
        for seq in group.seqs:
            if seq.status is SequenceStatus.RUNNING and seq.request_id in group.hidden:
                self.scheduler.abort(seq.request_id)
                self.scheduler.add(seq)

    def _collect_hidden(self, batch: ScheduledBatch, out: StepOutput) -> None:
        for b, seq in enumerate(batch.seqs):
            group = self._owner.get(seq.request_id)
            if group is None or not batch.sample[b] or seq.status is not SequenceStatus.RUNNING:
                continue
            if out.hidden is None:
                raise RuntimeError("beam search needs each step's hidden states (StepOutput.hidden)")
            group.hidden[seq.request_id] = out.hidden[b]

    def _advance(self, group: BeamGroup) -> list[GenerationOutput]:
        hidden = torch.stack([group.hidden.pop(seq.request_id) for seq in group.seqs])  # [S, H]
        logprobs, failures = beam_logprobs(self.embed, hidden, group.state.live, group.params)
        if failures:
            return [self._fail(group, next(iter(failures.values())))]
        parents = group.state.step(logprobs)
        old, group.seqs = group.seqs, []
        first_child = {parent: k for k, parent in reversed(list(enumerate(parents)))}
        for k, seq in enumerate(old):
            if k not in first_child:
                self._drop(seq)  # before any fork: at most beam_width beams hold blocks (admission.group_blocks)
        for k, (parent, beam) in enumerate(zip(parents, group.state.live, strict=True)):
            if first_child[parent] == k:
                old[parent].append_token((beam.tokens[-1],), None)
                group.seqs.append(old[parent])
            else:
                group.seqs.append(self._fork(group, old[parent], beam.tokens))
        if not group.state.done:
            return []
        self.groups.pop(group.request_id)
        return [group.output()]

    def _fork(self, group: BeamGroup, parent: Sequence, tokens: tuple[int, ...]) -> Sequence:
        """A new beam (tokens: parent's before this step, then its own new one); it shares parent's full computed
        blocks, or waits in the queue (and finds them in the prefix cache) when parent holds none or the pool is
        short."""
        child = group.new_sequence(tokens)
        if parent.status is SequenceStatus.RUNNING and self.scheduler.block_manager.can_fork(parent, child):
            self.scheduler.block_manager.fork(parent, child)
            self.scheduler.add_running(child)
        else:
            self.scheduler.add(child)
        self._track(group, child)
        return child

    def _track(self, group: BeamGroup, seq: Sequence) -> None:
        self._owner[seq.request_id] = group

    def _drop(self, seq: Sequence) -> None:
        self.scheduler.abort(seq.request_id)
        self._owner.pop(seq.request_id, None)

    def _fail(self, group: BeamGroup, error: Exception) -> GenerationOutput:
        self._close(group)
        return GenerationOutput.failed(group.request_id, error)

    def _close(self, group: BeamGroup) -> None:
        for request_id in [rid for rid, owner in self._owner.items() if owner is group]:  # also a half-made step's
            self.scheduler.abort(request_id)
            self._owner.pop(request_id)
        group.seqs = []
        self.groups.pop(group.request_id, None)
