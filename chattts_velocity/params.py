"""User-facing per-call parameters with upstream ChatTTS names, defaults and positional order.

`RefineTextParams` drives the refine-text pass, `InferCodeParams` the audio-code pass. Both are
validated on construction and turned into engine `SamplingParams` by `to_sampling_params`.
Unlike upstream, `Chat.infer` never mutates a params object (nor a shared default).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .schema import LogitsProcessor, SamplingParams



@dataclass(repr=False, eq=False)
class RefineTextParams:
    prompt: str = ""
    top_P: float | None = 0.7
    top_K: int | None = 20
    temperature: float | list[float] = 0.7
    repetition_penalty: float = 1.0
    max_new_token: int = 384
    min_new_token: int = 0
    show_tqdm: bool = True
    ensure_non_empty: bool = True
    manual_seed: int | None = None
    logits_processors: tuple[LogitsProcessor, ...] = field(default=(), kw_only=True)  # ours, keyword-only

    def __post_init__(self) -> None:
        _check_common(self)

    def to_sampling_params(self, mode: str, eos_token_id: int, return_hidden: bool) -> SamplingParams:
        temperature = self.temperature
        if isinstance(temperature, (list, tuple)):
            temperature = tuple(float(t) for t in temperature)
        return SamplingParams(
            mode=mode,
            temperature=temperature,
            top_p=self.top_P,
            top_k=self.top_K,
            repetition_penalty=float(self.repetition_penalty),
            max_new_token=self.max_new_token,
            min_new_token=self.min_new_token,
            seed=self.manual_seed,
            eos_token_id=eos_token_id,
            logits_processors=tuple(self.logits_processors),
            return_hidden=return_hidden,
            ensure_non_empty=self.ensure_non_empty,
        )


@dataclass(repr=False, eq=False)
class InferCodeParams(RefineTextParams):
    prompt: str = "[speed_5]"
    temperature: float | list[float] = 0.3
    repetition_penalty: float = 1.05
    max_new_token: int = 2048
    spk_emb: str | None = None  # a speaker string (sample_random_speaker) or a [768] tensor
    spk_smp: str | None = None  # audio-prompt codes from sample_audio_speaker
    txt_smp: str | None = None  # the transcript of the audio prompt
    stream_batch: int = 24
    stream_speed: int = 12000
    pass_first_n_batches: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("stream_batch", "stream_speed"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)!r}")
        if self.pass_first_n_batches < 0:
            raise ValueError(f"pass_first_n_batches: must be >= 0, got {self.pass_first_n_batches!r}")
        if self.txt_smp is not None and self.spk_smp is None:
            raise ValueError("txt_smp: given without spk_smp; pass the audio prompt (sample_audio_speaker) too")


def _check_common(p: RefineTextParams) -> None:
    temps = p.temperature if isinstance(p.temperature, (list, tuple)) else [p.temperature]
    if not temps or any(not isinstance(t, (int, float)) or t <= 0 for t in temps):
        raise ValueError(f"temperature: every value must be a number > 0, got {p.temperature!r}")
    if p.top_P is not None and not (isinstance(p.top_P, (int, float)) and 0 < p.top_P <= 1):
        raise ValueError(f"top_P: must be in (0, 1] or None, got {p.top_P!r}")
    if p.top_K is not None and not (isinstance(p.top_K, int) and p.top_K >= 1):
        raise ValueError(f"top_K: must be an integer >= 1 or None, got {p.top_K!r}")
    if not isinstance(p.repetition_penalty, (int, float)) or p.repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty: must be > 0, got {p.repetition_penalty!r}")
    if not isinstance(p.max_new_token, int) or p.max_new_token < 1:
        raise ValueError(f"max_new_token: must be an integer >= 1, got {p.max_new_token!r}")
    if not isinstance(p.min_new_token, int) or p.min_new_token < 0:
        raise ValueError(f"min_new_token: must be an integer >= 0, got {p.min_new_token!r}")
    if p.min_new_token > p.max_new_token:
        raise ValueError(
            f"min_new_token ({p.min_new_token}) is larger than max_new_token ({p.max_new_token})"
        )
    if p.manual_seed is not None and not isinstance(p.manual_seed, int):
        raise ValueError(f"manual_seed: must be an integer or None, got {p.manual_seed!r}")
