"""A synthesis job: one call's worth of speech, as every entry point (Chat, the page, the export) hands it over.

In: texts, their code-pass params (one for all or one per text), the mel source, the refine settings, the front
end's options, the output shape and the GPT backend to use. Out (through SpeechPipeline.synthesis(job): its verbs,
speech/synthesis.py): waveforms, refined texts, chunks, or each text's result. The pipeline and the job's runner
own refine, splitting, step caps, the one-call-at-a-time gate, flow control and interruption; callers only describe
the job.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..params import InferCodeParams, RefineTextParams
from ..text.script import Script
from .calls import Stop


@dataclass(frozen=True)
class TextOptions:
    """How texts become pieces (TextFrontEnd.pieces): language, normalisation, homophones, sentence splitting."""

    lang: str | None = None
    normalize: bool = True
    homophones: bool = True
    split: bool = True


GPT_PATHS = ("velocity", "plain")  # the GPT backends a local job may run on (Stages.gpt)
# What a job hands out: "whole" each text's whole clip (run's bytes), "chunks" windows as the GPT makes rows,
# "each" each text's own result as it finishes (Synthesis.each(): per-text errors, no refine pass).
SHAPES = ("whole", "chunks", "each")


@dataclass(frozen=True)
class SynthesisJob:
    """texts -> speech. `refine` None skips the refine pass; `refine_only` returns the refined texts instead of
    audio (one string per text, its pieces joined by newlines). `stop` is the caller's own stop flag (a page whose
    browser went away), beside `SpeechPipeline.interrupt()`."""

    texts: list[str]
    params: InferCodeParams | list[InferCodeParams] = field(default_factory=InferCodeParams)
    mel: str = "decoder"  # the mel source: "decoder" (hidden states) or "dvae" (codes)
    refine: RefineTextParams | None = None
    refine_only: bool = False
    text: TextOptions = field(default_factory=TextOptions)
    gpt: str | None = None  # GPT_PATHS: "velocity" (the engine) or "plain"; None: the one the pipeline loaded first
    max_batch: int | None = None  # pieces per GPT batch (upstream's max_split_batch); None: all at once
    progress: bool | None = None  # None: the code params' show_tqdm
    timestamps: bool = False  # shape "each": each text's sentence spans (audio.Spoken)
    stop: Stop | None = None
    max_pieces: int | None = None  # sentence pieces this caller accepts in one job (the server's limit); None: any
    weights_step_cap: bool = True  # max_new_token left at the default takes the weights' cap (False: the caller's own)
    shape: str = "whole"  # SHAPES
    first_chunk_samples: int = 0  # a stream's first chunk per piece at least this long (its encoder's first frame)
    window: int | None = None  # the engine runner: pieces generating at once, from the one being read; None: all
    script: Script | None = None  # texts are the script's turns: its pauses sound between them (AudioStream)

    def __post_init__(self) -> None:
        if isinstance(self.texts, str):
            object.__setattr__(self, "texts", [self.texts])
        if self.shape not in SHAPES:
            raise ValueError(f"shape: must be one of {', '.join(SHAPES)}, got {self.shape!r}")
        if self.shape == "each" and self.refine is not None:
            raise ValueError("refine: shape 'each' has no refine pass (refine the texts with refine_only=True first)")
        if self.script is not None and list(self.texts) != self.script.texts:
            raise ValueError("script: the job's texts must be its script's turns (script.texts)")
        if self.refine_only and self.refine is None:
            raise ValueError("refine_only: needs a refine pass (refine=RefineTextParams(...))")
        if isinstance(self.params, (list, tuple)) and isinstance(self.texts, list) \
                and len(self.params) != len(self.texts):
            raise ValueError(f"params: expected one InferCodeParams per text ({len(self.texts)}), "
                             f"got {len(self.params)}")

    def params_list(self) -> list[InferCodeParams]:
        """One InferCodeParams per text (texts already checked by the front end)."""
        if isinstance(self.params, (list, tuple)):
            return list(self.params)
        return [self.params] * (len(self.texts) if isinstance(self.texts, list) else 1)

    def shows_progress(self) -> bool:
        if self.progress is not None:
            return self.progress
        return all(p.show_tqdm for p in self.params_list())
