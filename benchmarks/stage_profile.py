"""Where `Chat.infer`'s wall time goes, per stage, for n concurrent texts (bench_cpu.py's "stages" keys).

Stages, timed by wrapping the objects one loaded Chat uses (nothing in the package changes):
- gpt_prefill / gpt_decode: the engine's model steps (ModelRunner.run: embeddings, the layers, heads and sampler);
  a step with any prompt row counts as prefill, a step of one new code per sequence as decode.
- planning: the scheduler's step plans (Scheduler.schedule: chunked prefill, batches, blocks) and the audio
  stage's length groups.
- decoder: the GPT-hidden-to-mel Decoder; vocos: Vocos (backbone, head, iSTFT).
- python: the rest of the wall time (text preparation, requests, the engine loop, hand-offs, copies).
A timed call inside another timed call counts once, in the outer stage.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

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
    source = chat.pipeline.mel("decoder")
    clock.wrap(source.model, "forward", "decoder")
    for name in ("forward", "decode_rows"):
        clock.wrap(source.vocos, name, "vocos")


def profile_infer(chat: Any, n: int, steps: int) -> dict:
    """Chat.infer of n texts of `steps` forced code steps each, end to end, split into STAGES and python."""
    import torch

    from benchmarks.bench_public import params, texts

    clock = StageClock()
    attach(clock, chat)
    try:
        with torch.inference_mode():
            start = time.perf_counter()
            wavs = chat.infer(texts(n), skip_refine_text=True, do_text_normalization=False, split_text=False,
                              params_infer_code=params(chat, steps))
            wall = time.perf_counter() - start
    finally:
        clock.undo()
    seconds = {**clock.seconds, "python": wall - sum(clock.seconds.values())}
    return {"concurrency": n, "steps": steps, "wall_s": wall, "audio_s": sum(len(w) for w in wavs) / 24000,
            "seconds": seconds, "share": {k: v / wall for k, v in seconds.items()}, "calls": clock.calls,
            "non_gpt_share": 1 - (seconds["gpt_prefill"] + seconds["gpt_decode"]) / wall}
