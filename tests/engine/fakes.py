"""Fakes for the engine's pure-Python core: prompts, sequences, schedulers and fake model runners."""
from __future__ import annotations

import hashlib

import torch

from chattts_velocity.config import EngineConfig
from chattts_velocity.engine.sched.block_manager import BlockManager
from chattts_velocity.engine.sched.scheduler import Scheduler
from chattts_velocity.engine.sched.sequence import Sequence
from chattts_velocity.engine.sched.step import ScheduledBatch, StepOutput
from chattts_velocity.engine.worker.sampling.sampler import Sampler
from chattts_velocity.schema import GenerationOutput, Prompt, SamplingParams

CODE_VOCAB = 626  # codes 0..624 + EOS 625
TEXT_VOCAB = 300  # small stand-in for head_text
HIDDEN = 8


def make_prompt(length: int, seed: int = 0, num_vq: int = 4, spk: torch.Tensor | None = None,
                num_audio: int = 0) -> Prompt:
    """Random prompt: text rows (ids repeated over the channels) then `num_audio` audio-code rows."""
    gen = torch.Generator().manual_seed(seed)
    text = torch.randint(0, 500, (length - num_audio, 1), generator=gen).expand(-1, num_vq)
    audio = torch.randint(0, 625, (num_audio, num_vq), generator=gen)
    mask = torch.arange(length) < length - num_audio
    return Prompt(torch.cat([text, audio]), mask, spk, (1,) if spk is not None else ())



def snapshot(seq: Sequence) -> GenerationOutput:
    """Everything a sequence has generated so far, as one output (hidden float32, None if none kept)."""
    hidden = seq.hidden_states()
    return GenerationOutput(
        request_id=seq.request_id,
        token_ids=seq.token_ids(),  # [G, num_rows]
        hidden=None if hidden is None or hidden.shape[0] == 0 else hidden.float(),  # [G, H]
        finished=seq.is_finished,
        finish_reason=seq.finish_reason,
    )


def recent_tokens(seq: Sequence, window: int) -> torch.Tensor:
    """The last `window` generated tokens per row, oldest first: [num_rows, <=window] int64."""
    recent = seq.generated[-window:] if window > 0 else []
    return torch.tensor(recent, dtype=torch.int64).view(-1, seq.num_rows).T

def make_seqs(n: int, prompt_len: int = 8, same_prompt: bool = False, **params) -> list[Sequence]:
    """n sequences `req-i` arriving at t=i; distinct prompts unless same_prompt."""
    params.setdefault("seed", None)
    return [Sequence(f"req-{i}", make_prompt(prompt_len, seed=0 if same_prompt else i),
                     SamplingParams(**params), arrival=float(i)) for i in range(n)]


def make_scheduler(num_blocks: int = 64, block_size: int = 4, enable_prefix_caching: bool = True,
                   **engine) -> Scheduler:
    config = EngineConfig.from_kwargs(block_size=block_size, enable_prefix_caching=enable_prefix_caching, **engine)
    return Scheduler(config, BlockManager(num_blocks, block_size, enable_prefix_caching))


class ScriptedRunner:
    """Returns scripted tokens: script[request_id][k] for generated step k, else (k+1,)*rows.

    hidden[b] = [k, arrival, 0...] so tests can check which step a hidden state belongs to.
    """

    def __init__(self, script: dict[str, list[tuple[int, ...]]] | None = None) -> None:
        self.script = script or {}
        self.batches: list[ScheduledBatch] = []

    def step(self, batch: ScheduledBatch) -> StepOutput:
        self.batches.append(batch)
        tokens = torch.zeros(batch.num_seqs, 4, dtype=torch.int64)
        hidden = torch.zeros(batch.num_seqs, HIDDEN)
        for b, seq in enumerate(batch.seqs):
            k = seq.num_generated
            script = self.script.get(seq.request_id, [])
            token = script[k] if k < len(script) else (k + 1,) * seq.num_rows
            tokens[b, : seq.num_rows] = torch.tensor(token)
            hidden[b, 0], hidden[b, 1] = k, seq.arrival
        return StepOutput(tokens, hidden, list(batch.sample))


class KVFakeRunner:
    """A fake model over a simulated paged KV cache.

    Computing position p writes kv[p] = H(kv[p-1] read back through the block table, salt, row p),
    so a slot's value depends on the whole prefix, like real KV. A sampled sequence's logits are
    random numbers seeded by the KV of its last position; tokens come from the real Sampler.
    Reading a slot that was never written, or a stale/wrong shared block, changes the outputs.
    """

    def __init__(self, block_size: int, eos_bias: float = 0.0) -> None:
        self.block_size = block_size
        self.eos_bias = eos_bias
        self.kv: dict[int, dict[int, bytes]] = {}
        self.sampler = Sampler()

    def _slot(self, seq: Sequence, pos: int) -> tuple[int, int]:
        return seq.block_table[pos // self.block_size], pos % self.block_size

    def _compute(self, seq: Sequence, start: int, num: int, is_prefill: bool) -> bytes:
        if is_prefill:
            ids, mask = seq.rows(start, start + num)
        else:  # the decode fast path a real runner takes
            ids, mask = torch.tensor([seq.last_row]), torch.tensor([seq.is_text])
        prev = b"" if start == 0 else self._read(seq, start - 1)
        for i in range(num):
            digest = hashlib.blake2b(prev + seq.cache_salt, digest_size=16)
            digest.update(ids[i].numpy().tobytes() + mask[i].numpy().tobytes())
            prev = digest.digest()
            block, slot = self._slot(seq, start + i)
            self.kv.setdefault(block, {})[slot] = prev
        return prev

    def _read(self, seq: Sequence, pos: int) -> bytes:
        block, slot = self._slot(seq, pos)
        return self.kv[block][slot]  # KeyError: reading KV that was never computed

    def _logits(self, state: bytes, seq: Sequence) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(int.from_bytes(state[:8], "little"))
        vocab = TEXT_VOCAB if seq.is_text else CODE_VOCAB
        logits = torch.randn(seq.num_rows, vocab, generator=gen) * 2
        logits[:, seq.params.eos_token_id] += self.eos_bias
        return logits, torch.randn(HIDDEN, generator=gen)

    def step(self, batch: ScheduledBatch) -> StepOutput:
        tokens = torch.zeros(batch.num_seqs, 4, dtype=torch.int64)
        hidden = torch.zeros(batch.num_seqs, HIDDEN)
        logits: dict[int, list[tuple[int, torch.Tensor]]] = {}  # rows -> [(b, logits [rows, V])]
        for b, seq in enumerate(batch.seqs):
            state = self._compute(seq, batch.num_computed_tokens[b], batch.num_new_tokens[b],
                                  batch.is_prefill[b])
            if batch.sample[b]:
                row_logits, hidden[b] = self._logits(state, seq)
                logits.setdefault(seq.num_rows, []).append((b, row_logits))
        for rows, group in logits.items():  # one batched sampler call per mode, as the runner does
            index = [b for b, _ in group]
            sampling = self.sampler.prepare([batch.seqs[b] for b in index], rows)
            tokens[index, :rows] = self.sampler.sample(torch.cat([lg for _, lg in group]), sampling)
        return StepOutput(tokens, hidden, list(batch.sample))


def run(scheduler: Scheduler, runner: ScriptedRunner | KVFakeRunner, max_steps: int = 10_000,
        on_step=None) -> dict[str, Sequence]:
    """Step until nothing is unfinished; returns every finished sequence by request id."""
    done: dict[str, Sequence] = {}
    for step in range(max_steps):
        if not scheduler.has_unfinished():
            return done
        batch = scheduler.schedule()
        for seq in scheduler.postprocess(batch, runner.step(batch)):
            done[seq.request_id] = seq
        if on_step is not None:
            on_step(step, scheduler, batch)
    raise AssertionError(f"not finished after {max_steps} steps")


def text_prompt(i: int, text_vocab: int) -> Prompt:
    """Request i's text prompt: 3 + 2i ids, so that every request has a length of its own."""
    ids = (torch.arange(3 + 2 * i) * 7 + i) % text_vocab
    return Prompt(ids[:, None].repeat(1, 4), torch.ones(len(ids), dtype=torch.bool))


def varied_params(i: int, steps: int, **kw: object) -> SamplingParams:
    """Request i's sampling: seeded, with top-P, top-K, penalty and window varying by i, forced to `steps`."""
    base: dict[str, object] = dict(temperature=0.7, top_p=0.7 if i % 2 else None, top_k=20 if i % 3 else None,
                                   repetition_penalty=1.05 + 0.05 * (i % 2), penalty_window=4 + 4 * (i % 3),
                                   seed=100 + i, max_new_token=steps, min_new_token=steps, return_hidden=i != 1)
    return SamplingParams(**{**base, **kw})  # type: ignore[arg-type]
