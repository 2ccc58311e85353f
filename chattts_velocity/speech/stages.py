"""The speech stages, built once from the assets: what a job's runner and Chat's upstream-style steps use.

texts -> TextFrontEnd (normalise, split, voice, prompts) -> GPTBackend (refine pass, then code pass)
      -> MelSource (Decoder on hidden states or DVAE on codes; Vocos) -> float32 24 kHz waveforms.
`Stages` holds them with the steps between them (a job's preparation, a shape-'each' job's per-text requests) and
the one call gate; `SpeechPipeline` (pipeline.py) wraps it in the use cases. The GPT backends are named by path:
"velocity" (the engine) or "plain" (the padded-batch loop); both may live side by side.
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from ..assets import AssetPaths
from ..audio import DVAE, Decoder, Vocos, load_safetensors
from ..config import ModelConfig
from ..demo import default_max_new_token
from ..engine.gpt import GPTBackend, load_pretrained
from ..engine.llm_engine import LLMEngine
from ..params import InferCodeParams
from ..precision import Precision
from ..schema import SpeechRequests, TextPieces
from ..text import Normalizer, Tokenizer, empty_text
from .calls import CallGate, PerTextRequests
from .frontend import TextFrontEnd
from .job import GPT_PATHS, SynthesisJob
from .mel_source import MEL_SOURCES, MelSource, mel_sources
from .prepare import PreparedJob, Preparer, check_piece_count, step_capped


class Stages:
    """Text front end + GPT backends + mel sources + Vocos for one asset folder and one Precision; `gpt` is the
    backend loaded first (the one a job that names none runs on)."""

    def __init__(self, paths: AssetPaths, precision: Precision, gpt: str, normalizer: Normalizer | None,
                 gpt_options: dict[str, object]) -> None:
        check_gpt(gpt)
        self.paths, self.precision, self.default_gpt = paths, precision, gpt
        self.step_cap = default_max_new_token(paths.root)  # these weights' default cap (demo weights: the CLI's)
        self._gpt_options: dict[str, Any] = dict(gpt_options)  # load_pretrained's keywords: EngineConfig checks them
        self._gpts: dict[str, GPTBackend] = {}  # GPT_PATHS name -> the backend load_pretrained chose
        self._loading = threading.Lock()
        self.gate = CallGate()  # one local call at a time through the model
        device = precision.device
        self.dvae = DVAE.from_state_dict(load_safetensors(paths.dvae)).to(device).eval()
        self.decoder = Decoder.from_state_dict(load_safetensors(paths.decoder)).to(device).eval()
        self.vocos = Vocos.from_state_dict(load_safetensors(paths.vocos)).to(device).eval()
        self.mel_sources = mel_sources(self.decoder, self.dvae, self.vocos, precision)
        config = self.gpt().config
        self.frontend = TextFrontEnd(Tokenizer(paths.tokenizer_dir), config.hidden_size, config.audio_eos_id,
                                     normalizer)
        self.preparer = Preparer(self.frontend, self.step_cap)

    # ---- the stages ------------------------------------------------------------------------------
    def gpt(self, name: str | None = None) -> GPTBackend:
        """The GPT backend on path `name` ("velocity" or "plain"; None: the one loaded first), loaded on first use."""
        name = self.default_gpt if name is None else check_gpt(name)
        with self._loading:  # two threads asking for a backend not loaded yet load it once
            if name not in self._gpts:
                self._gpts[name] = load_pretrained(self.paths, is_vllm=name == "velocity", precision=self.precision,
                                                   **self._gpt_options)
        return self._gpts[name]

    def engine(self) -> LLMEngine:
        """The velocity engine (loaded on first use), for callers that step it themselves (server, Ray)."""
        engine = self.gpt("velocity").engine
        if engine is None:
            raise RuntimeError("engine: the velocity GPT backend holds no LLMEngine")
        return engine

    @property
    def config(self) -> ModelConfig:
        """The GPT's dimensions (hidden_size is a speaker vector's width)."""
        return self.gpt().config

    def mel(self, name: str = "decoder") -> MelSource:
        """The mel source named `name` (MEL_SOURCES: "decoder" on hidden states, "dvae" on codes)."""
        if name not in self.mel_sources:
            raise ValueError(f"mel source: must be one of {list(MEL_SOURCES)}, got {name!r}")
        return self.mel_sources[name]

    # ---- texts -> requests ---------------------------------------------------------------------------
    def code_requests(self, pieces: TextPieces, params: InferCodeParams | list[InferCodeParams],
                      mel: MelSource | None = None) -> SpeechRequests:
        """One code-pass request per piece, returning what `mel` decodes (default: the Decoder's hidden states)."""
        return self.frontend.code_requests(pieces, params, return_hidden=(mel or self.mel()).return_hidden)

    def pieces(self, job: SynthesisJob, allow_empty: bool = False) -> TextPieces:
        """The job's texts, checked and split by its TextOptions (TextFrontEnd.pieces)."""
        o = job.text
        return self.frontend.pieces(job.texts, lang=o.lang, normalize=o.normalize, homophones=o.homophones,
                                    split=o.split, allow_empty=allow_empty)

    def prepare(self, job: SynthesisJob, pieces: TextPieces | None = None) -> PreparedJob:
        """The job made ready before its turn (speech/prepare.py): its GPT loaded, its texts checked and split (or
        `pieces`: its texts split elsewhere by pieces(job), as the server does for long texts in a worker process),
        its params step-capped, and its code requests built, or its refine pass `pending`."""
        mel = self.mel(job.mel)
        self.gpt(job.gpt)  # loaded (or its load failed) before the call waits for its turn
        return self.preparer.start(job, mel, self.pieces(job) if pieces is None else pieces)

    def refined(self, prepared: PreparedJob, token_ids: list[torch.Tensor]) -> PreparedJob:
        """prepared after its pending refine pass (token_ids [T, 1] per prompt): its code requests built."""
        return self.preparer.refined(prepared, token_ids)

    def each_requests(self, job: SynthesisJob) -> PerTextRequests:
        """A shape-'each' job's requests: each text's with its own params, in one flat list; a text that cannot be
        made (no piece, a bad speaker) is recorded in PerTextRequests.failed with its ValueError, and the others
        go on."""
        pieces = self.pieces(job, allow_empty=True)
        check_piece_count(job, pieces)
        self.gpt(job.gpt)  # loaded (or its load failed) before the call waits for its turn
        requests = PerTextRequests(pieces, self.mel(job.mel))
        for i, params in enumerate(self.preparer.params(job)):
            try:
                if not pieces.of_text(i).texts:
                    raise empty_text(i)
                requests.add(i, self.code_requests(pieces.of_text(i), params, requests.mel))
            except ValueError as exc:
                requests.failed.append((i, exc))
        return requests

    def step_capped(self, params: list[InferCodeParams]) -> list[InferCodeParams]:
        """Each params with the loaded weights' default step cap (step_cap, decided at load) where max_new_token
        was left at InferCodeParams' default; an explicit max_new_token is kept."""
        return step_capped(params, self.step_cap)

    def shutdown(self) -> None:
        """Release the GPT backends' threads and memory."""
        for gpt in self._gpts.values():
            gpt.shutdown()
        self._gpts.clear()


def check_gpt(name: str) -> str:
    if name not in GPT_PATHS:
        raise ValueError(f"gpt: must be one of {', '.join(GPT_PATHS)}, got {name!r}")
    return name
