"""Benchmark helpers that time ChatTTS work through the public API only (Chat and its public seams).

`Chat.infer(texts)` is `gpt.generate(speech_requests(split(texts)))` then one batched Decoder + Vocos pass; the
helpers call those same public steps so that the GPT and the audio decode can be timed apart. Every request is
forced to `steps` code steps (min_new_token == max_new_token); one code step = 4 codes = one position.

`profile_infer` splits `Chat.infer`'s wall time per stage (bench_cpu.py's "stages" keys), timed by wrapping the
objects one loaded Chat uses (nothing in the package changes):
- gpt_prefill / gpt_decode: the engine's model steps (ModelRunner.run: embeddings, the layers, heads and sampler);
  a step with any prompt row counts as prefill, a step of one new code per sequence as decode.
- planning: the scheduler's step plans (Scheduler.schedule: chunked prefill, batches, blocks) and the audio
  stage's length groups.
- decoder: the GPT-hidden-to-mel Decoder; vocos: Vocos (backbone, head, iSTFT).
- python: the rest of the wall time (text preparation, requests, the engine loop, hand-offs, copies).
A timed call inside another timed call counts once, in the outer stage.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from chattts_velocity import Chat, InferCodeParams
from chattts_velocity.audio import decode_hidden_batch
from chattts_velocity.precision import Precision
from chattts_velocity.speech import DecoderSource, StreamOptions, StreamSet, SynthesisJob, TextOptions

SENTENCES = [
    "The quick brown fox jumps over the lazy dog near the river bank",
    "Speech synthesis turns written words into natural sounding audio",
    "Every request in this benchmark is forced to the same length",
    "Please remember to bring an umbrella tomorrow morning",
]


WORDS = ["red", "green", "blue", "amber", "violet", "silver", "golden", "white"]


def texts(n: int) -> list[str]:
    """n distinct texts (no digits: the benchmark skips normalisation, and digits would be dropped)."""
    return [f"{SENTENCES[i % 4]} {WORDS[i // 4 % 8]} {WORDS[i // 32 % 8]}" for i in range(n)]


def load_chat(model: str, dtype: str, threads: int) -> Chat:
    from chattts_velocity.demo import ensure_model

    torch.set_num_threads(threads)
    chat = Chat()
    chat.load(source="custom", custom_path=ensure_model(model)[0], verify=False, use_vllm=True, dtype=dtype,
              num_threads=threads)
    return chat


def params(chat: Chat, steps: int) -> InferCodeParams:
    torch.manual_seed(0)
    return InferCodeParams(spk_emb=chat.sample_random_speaker(), max_new_token=steps, min_new_token=steps,
                           manual_seed=1, show_tqdm=False)


def requests(chat: Chat, n: int, steps: int):
    pieces = chat.split(texts(n), do_text_normalization=False, split_text=False)
    return chat.speech_requests(pieces, params(chat, steps))


def decode_rate(chat: Chat, n: int, steps: int) -> float:
    """Code steps per second per the whole batch with prefill excluded: counted from the moment every request
    has its first code (the llama.cpp side times the same span)."""
    reqs = requests(chat, n, steps)
    with torch.inference_mode():
        started, counted, t0 = set(), 0, None
        for deltas in chat.gpt(True).stream(reqs.prompts, reqs.sampling, 1):
            if t0 is not None:
                counted += sum(len(d.token_ids) for _, d in deltas)
            started |= {k for k, d in deltas if len(d.token_ids)}
            if t0 is None and len(started) == n:
                t0 = time.perf_counter()
        return counted / (time.perf_counter() - t0)


@dataclass
class BatchRun:
    concurrency: int
    steps: int
    gpt_seconds: float  # submission -> every request's last code (prefill included)
    decode_seconds: float  # one batched Decoder + Vocos pass over every request's hidden states

    @property
    def steps_per_s_e2e(self) -> float:
        return self.concurrency * self.steps / (self.gpt_seconds + self.decode_seconds)

    @property
    def steps_per_s_gpt(self) -> float:
        return self.concurrency * self.steps / self.gpt_seconds

    @property
    def decode_share(self) -> float:
        return self.decode_seconds / (self.gpt_seconds + self.decode_seconds)

    def as_dict(self) -> dict:
        return {**asdict(self), "steps_per_s_e2e": self.steps_per_s_e2e, "steps_per_s_gpt": self.steps_per_s_gpt,
                "decode_share": self.decode_share}


def batch_run(chat: Chat, n: int, steps: int) -> BatchRun:
    """Chat.infer(n texts) end to end, its GPT and its audio decode timed apart."""
    reqs = requests(chat, n, steps)
    with torch.inference_mode():
        start = time.perf_counter()
        outputs = chat.gpt(True).generate(reqs.prompts, reqs.sampling, False)
        gpt = time.perf_counter() - start
        chat.pipeline.stages.mel("decoder").decode(outputs)
    return BatchRun(n, steps, gpt, time.perf_counter() - start - gpt)


def stream_ttfa(chat: Chat, n: int, steps: int, options: StreamOptions) -> dict:
    """n texts streamed at once as Chat.infer(stream=True) streams them, with `options`: seconds from submission
    to each text's first audio."""
    job = SynthesisJob(texts(n), params(chat, steps), text=TextOptions(normalize=False, split=False), gpt="velocity",
                       shape="chunks")
    first: dict[int, float] = {}
    start = time.perf_counter()
    for chunks in chat.pipeline.synthesis(job, options).stream():
        for k, chunk in enumerate(chunks):
            if len(chunk):
                first.setdefault(k, time.perf_counter() - start)
    ttfa = [first.get(k, float("nan")) for k in range(n)]
    return {"options": asdict(options), "concurrency": n, "ttfa": ttfa, "ttfa_max": max(ttfa),
            "ttfa_median": statistics.median(ttfa)}


def one_clip(chat: Chat, steps: int) -> torch.Tensor:  # -> hidden [steps, H]
    reqs = requests(chat, 1, steps)
    with torch.inference_mode():
        return chat.gpt(True).generate(reqs.prompts, reqs.sampling, False)[0].hidden


def first_chunk_error(chat: Chat, hidden: torch.Tensor, options: StreamOptions) -> float:
    """Max |streamed - whole clip| over the first chunk of one clip pushed step by step, both in float32 (bf16
    rounding would hide what the window costs); later chunks are exact by construction."""
    with torch.inference_mode():
        whole = decode_hidden_batch(chat.decoder, chat.vocos, [hidden])[0]
        streams = StreamSet(options)
        exact = Precision.decide(device=chat.device, decode_dtype="float32")
        streams.open(0, DecoderSource(chat.decoder, chat.vocos, exact))
        for row in hidden.split(1):
            chunk = streams.push({0: row}).get(0, np.zeros(0))
            if len(chunk):
                return float(np.abs(chunk - whole[: len(chunk)]).max())
    return float("nan")  # the clip ended before its first chunk: raise steps

STAGES = ("gpt_prefill", "gpt_decode", "planning", "decoder", "vocos")


class StageClock:
    """Wraps bound methods of live objects with timers, per stage; undo() puts the originals back."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.calls = dict.fromkeys(STAGES, 0)
        self._depth = 0
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, stage: str | Callable[..., str]) -> None:
        """owner.name(...) timed into `stage` (or stage(*args) for the stage of a call); absent names are skipped."""
        original = getattr(owner, name, None)
        if original is None:
            return
        had_own = name in vars(owner)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return original(*args, **kwargs)
            which = stage(*args) if callable(stage) else stage
            self._depth += 1
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[which] += time.perf_counter() - start
                self.calls[which] += 1
                self._depth -= 1

        setattr(owner, name, timed)
        self._undo.append((owner, name, original if had_own else None))

    def undo(self) -> None:
        for owner, name, original in reversed(self._undo):
            if original is None:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
        self._undo.clear()


def attach(clock: StageClock, chat: Any) -> None:
    """Every stage's timer on `chat`'s engine and decoder-mel path."""
    engine = chat.engine()
    clock.wrap(engine.runner, "run", lambda batch: "gpt_decode" if batch.is_decode_only else "gpt_prefill")
    clock.wrap(engine.scheduler, "schedule", "planning")
    source = chat.pipeline.stages.mel("decoder")
    clock.wrap(source.model, "forward", "decoder")
    for name in ("forward", "decode_rows"):
        clock.wrap(source.vocos, name, "vocos")
    from chattts_velocity.audio import cpu_decode, cpu_panels  # the CPU's bf16 paths call no module forward

    clock.wrap(cpu_decode, "mel_frames", "decoder")
    clock.wrap(cpu_decode, "vocos_wav", "vocos")
    clock.wrap(cpu_panels, "mels", "decoder")
    clock.wrap(cpu_panels, "wavs", "vocos")


def profile_infer(chat: Any, n: int, steps: int) -> dict:
    """Chat.infer of n texts of `steps` forced code steps each, end to end, split into STAGES and python."""
    clock, code_params = StageClock(), params(chat, steps)  # the voice string is drawn before the clock starts
    attach(clock, chat)
    try:
        with torch.inference_mode():
            start = time.perf_counter()
            wavs = chat.infer(texts(n), skip_refine_text=True, do_text_normalization=False, split_text=False,
                              params_infer_code=code_params)
            wall = time.perf_counter() - start
    finally:
        clock.undo()
    seconds = {**clock.seconds, "python": wall - sum(clock.seconds.values())}
    return {"concurrency": n, "steps": steps, "wall_s": wall, "audio_s": sum(len(w) for w in wavs) / 24000,
            "seconds": seconds, "share": {k: v / wall for k, v in seconds.items()}, "calls": clock.calls,
            "non_gpt_share": 1 - (seconds["gpt_prefill"] + seconds["gpt_decode"]) / wall}
