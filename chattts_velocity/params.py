"""User-facing per-call parameters with upstream ChatTTS names, defaults and positional order.

`RefineTextParams` drives the refine-text pass, `InferCodeParams` the audio-code pass. Both are
validated on construction and turned into engine `SamplingParams` by `to_sampling_params`.
Unlike upstream, `Chat.infer` never mutates a params object (nor a shared default).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .schema import (
    CODE_PROMPT,
    MAX_NEW_TOKEN,
    REFINE_MAX_NEW_TOKEN,
    SAMPLING_RULES,
    LogitsProcessor,
    Mode,
    SamplingParams,
    check_sampling,
)

# SamplingParams' name -> the upstream name these params use (for values and error messages)
UPSTREAM_NAMES = {"top_p": "top_P", "top_k": "top_K", "seed": "manual_seed"}


@dataclass(repr=False, eq=False)
class RefineTextParams:
    prompt: str = ""
    top_P: float | None = 0.7
    top_K: int | None = 20
    temperature: float | list[float] = 0.7
    repetition_penalty: float = 1.0
    max_new_token: int = REFINE_MAX_NEW_TOKEN
    min_new_token: int = 0
    show_tqdm: bool = True
    ensure_non_empty: bool = True
    manual_seed: int | None = None
    logits_processors: tuple[LogitsProcessor, ...] = field(default=(), kw_only=True)  # ours, keyword-only
    # ours, keyword-only: > 1 refines by beam search (deterministic, highest likelihood) instead of sampling
    beam_width: int = field(default=1, kw_only=True)

    def __post_init__(self) -> None:
        check_sampling(self.sampling_values(), UPSTREAM_NAMES)

    def sampling_values(self) -> dict[str, object]:
        """Our sampling fields under SamplingParams' names (every SAMPLING_RULES entry we have)."""
        ours = {name: UPSTREAM_NAMES.get(name, name) for name in SAMPLING_RULES}
        return {name: getattr(self, mine) for name, mine in ours.items() if hasattr(self, mine)}

    def to_sampling_params(self, mode: Mode, eos_token_id: int, return_hidden: bool) -> SamplingParams:
        values: dict[str, Any] = self.sampling_values()  # SamplingParams' keywords, each checked (check_sampling)
        if isinstance(self.temperature, (list, tuple)):
            values["temperature"] = tuple(float(t) for t in self.temperature)
        values["repetition_penalty"] = float(self.repetition_penalty)
        return SamplingParams(
            mode=mode, eos_token_id=eos_token_id, logits_processors=tuple(self.logits_processors),
            return_hidden=return_hidden, ensure_non_empty=self.ensure_non_empty, **values,
        )


SHARED_MAX_BEAMS = 8  # refine beams one request may ask of a shared model (server, page): each beam is a sequence


@dataclass(repr=False, eq=False)
class InferCodeParams(RefineTextParams):
    prompt: str = CODE_PROMPT
    temperature: float | list[float] = 0.3
    repetition_penalty: float = 1.05
    max_new_token: int = MAX_NEW_TOKEN
    spk_emb: str | None = None  # a speaker string (sample_random_speaker) or a [768] tensor
    spk_smp: str | None = None  # audio-prompt codes from sample_audio_speaker
    txt_smp: str | None = None  # the transcript of the audio prompt
    stream_batch: int = 24
    stream_speed: int = 12000
    pass_first_n_batches: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.beam_width != 1:
            raise ValueError(f"beam_width: beam search is for the refine-text pass (RefineTextParams); the "
                             f"audio-code pass samples its codebooks, got {self.beam_width!r}")
        for name, low in (("stream_batch", 1), ("stream_speed", 1), ("pass_first_n_batches", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: must be an integer >= {low}, got {value!r}")
        if self.txt_smp is not None and self.spk_smp is None:
            raise ValueError("txt_smp: given without spk_smp; pass the audio prompt (sample_audio_speaker) too")

