"""SpeechPipeline: the speech stages built once from the assets (speech/stages.py), and the use cases every caller
shares: a job's verbs (`synthesis(job)`), voices (`speakers`), `interrupt`, `shutdown`.

`Chat` (upstream's facade), the server's SpeechService, the export and the web UI all hold one. Precision and
device are decided here once (`self.precision`, precision.py) and handed to the engine, the plain path and the audio
stage as that one object.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..assets import AssetPaths
from ..config import ModelConfig
from ..engine.loading.host import decide_here
from ..precision import Precision
from ..text import Normalizer
from .job import SynthesisJob
from .local_runner import LocalRunner
from .speakers import Speakers
from .stages import Stages
from .streams import StreamOptions
from .synthesis import Runner, Synthesis


class SpeechPipeline:
    """The stages for one asset folder on one device (`stages`: what runners and Chat's low-level steps use), its
    voices (`speakers`) and its use cases."""

    def __init__(self, paths: AssetPaths, *, precision: Precision, gpt: str, normalizer: Normalizer | None,
                 gpt_options: dict[str, object]) -> None:
        self.precision, self.paths = precision, paths
        self.stages = Stages(paths, precision, gpt, normalizer, gpt_options)
        self.speakers = Speakers(self.stages.frontend, self.stages.dvae, self.device, self.stages.gate)

    @classmethod
    def load(cls, paths: AssetPaths | str | Path, *, device: str | torch.device | None = None,
             gpt: str = "plain", dtype: str = "float32", decode_dtype: str | None = None,
             kv_cache_dtype: str = "auto", normalizer: Normalizer | None = None,
             **gpt_options: object) -> SpeechPipeline:
        """Load every module from an asset folder (verified or not: that is the caller's choice).

        gpt: the GPT backend loaded now ("velocity": the engine, or "plain"; the other loads on first use). dtype:
        the GPT's weights ("float32", "bfloat16", "int8", "int4"; "auto": the fastest accepted here); decode_dtype:
        the Decoder's and Vocos's ("bfloat16" or "float32"; None picks bfloat16 on CUDA, or with a
        reduced-precision GPT on a CPU with native bf16); kv_cache_dtype: "auto" or "int8". gpt_options:
        load_pretrained's (compile, EngineConfig fields). device None: CUDA when available, else the CPU. Device
        and precision are decided here, once, into one `Precision` that the engine, the plain path and the audio
        stage read.
        """
        paths = paths if isinstance(paths, AssetPaths) else AssetPaths.from_root(paths)
        precision = decide_here(dtype, kv_cache_dtype, decode_dtype, device, str(gpt_options.get("backend", "auto")))
        return cls(paths, precision=precision, gpt=gpt, normalizer=normalizer, gpt_options=gpt_options)

    @property
    def device(self) -> torch.device:
        """Where every stage runs (the precision's device)."""
        return self.precision.device

    @property
    def dtype(self) -> str:
        """The precision's name ("auto" resolved)."""
        return self.precision.dtype

    @property
    def decode_dtype(self) -> torch.dtype | None:
        """The audio decode's autocast dtype (None: exact float32)."""
        return self.precision.audio

    @property
    def config(self) -> ModelConfig:
        """The GPT's dimensions (hidden_size is a speaker vector's width)."""
        return self.stages.config

    # ---- use cases: what Chat, the server, the page and the export call ---------------------------------
    def synthesis(self, job: SynthesisJob, chunking: StreamOptions | None = None,
                  runner: Runner | None = None) -> Synthesis:
        """The job with its verbs (speech/synthesis.py): run() the whole audio, stream() chunks as made (in the
        job's shape), arun()/astream() for an event loop, open() (the server's one track), each() (shape 'each'),
        cancel(). `runner`: where its GPT work runs (None: this pipeline's own GPT backend, one call at a time;
        texts are checked now)."""
        return Synthesis(self.stages, job, runner or LocalRunner(), chunking)

    def interrupt(self) -> None:
        """Stop every local call in flight (running or waiting for its turn) after its current step; each returns
        what it has. A call made afterwards is not affected."""
        self.stages.gate.interrupt()

    def shutdown(self) -> None:
        """Release the GPT backends' threads and memory; the pipeline is unusable afterwards."""
        self.stages.shutdown()
