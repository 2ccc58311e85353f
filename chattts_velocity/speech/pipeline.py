"""SpeechPipeline: the speech stages built once from the assets, and the operations every caller shares.

texts -> TextFrontEnd (normalise, split, voice, prompts) -> GPTBackend (refine pass, then code pass)
      -> MelSource (Decoder on hidden states or DVAE on codes; Vocos) -> float32 24 kHz waveforms.
`Chat` (upstream's facade), the server's SpeechService, the export and the web UI all hold one. Precision and
device are decided here once (`self.precision`, precision.py) and handed to the engine, the plain path and the audio
stage as that one object.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..assets import AssetPaths
from ..audio import DVAE, Decoder, Spoken, Vocos, load_safetensors
from ..config import ModelConfig
from ..demo import default_max_new_token
from ..engine.gpt import GPTBackend, load_pretrained
from ..engine.llm_engine import LLMEngine
from ..engine.loading.host import decide_here
from ..params import InferCodeParams
from ..precision import Precision
from ..schema import SpeechRequests, TextPieces
from ..text import Normalizer, Tokenizer, empty_text
from .calls import CallGate, PerTextRequests
from .frontend import TextFrontEnd
from .job import SynthesisJob
from .local_runner import LocalRunner
from .mel_source import MEL_SOURCES, MelSource, mel_sources
from .prepare import PreparedJob, Preparer, check_piece_count, step_capped
from .speakers import Speakers
from .streams import StreamOptions
from .synthesis import Runner, Synthesis


class SpeechPipeline:
    """Text front end + GPT backend(s) + mel sources + Vocos, for one asset folder on one device."""

    def __init__(self, paths: AssetPaths, *, precision: Precision, use_vllm: bool, normalizer: Normalizer | None,
                 gpt_options: dict[str, object]) -> None:
        self.precision, self.paths, self.default_use_vllm = precision, paths, use_vllm
        self.step_cap = default_max_new_token(paths.root)  # these weights' default cap (demo weights: the CLI's)
        self._gpt_options: dict[str, Any] = dict(gpt_options)  # load_pretrained's keywords: EngineConfig checks them
        self._gpts: dict[bool, GPTBackend] = {}  # use_vllm -> the backend load_pretrained chose
        self._loading = threading.Lock()
        self.gate = CallGate()  # one call at a time through the model (run, run_each, stream)
        tokenizer = Tokenizer(paths.tokenizer_dir)
        self.dvae = DVAE.from_state_dict(load_safetensors(paths.dvae)).to(self.device).eval()
        self.decoder = Decoder.from_state_dict(load_safetensors(paths.decoder)).to(self.device).eval()
        self.vocos = Vocos.from_state_dict(load_safetensors(paths.vocos)).to(self.device).eval()
        self.mel_sources = mel_sources(self.decoder, self.dvae, self.vocos, precision)
        config = self.gpt().config
        self.frontend = TextFrontEnd(tokenizer, config.hidden_size, config.audio_eos_id, normalizer)
        self.preparer = Preparer(self.frontend, self.step_cap)
        self.speakers = Speakers(self.frontend, self.dvae, self.device, self.gate)  # draws, clip codes, the check

    @classmethod
    def load(cls, paths: AssetPaths | str | Path, *, device: str | torch.device | None = None,
             use_vllm: bool = False, dtype: str = "float32", decode_dtype: str | None = None,
             kv_cache_dtype: str = "auto", normalizer: Normalizer | None = None,
             **gpt_options: object) -> SpeechPipeline:
        """Load every module from an asset folder (verified or not: that is the caller's choice).

        use_vllm: the GPT backend loaded now (the other loads on first use). dtype: the GPT's weights ("float32",
        "bfloat16", "int8", "int4"; "auto": the fastest accepted here); decode_dtype: the Decoder's and Vocos's
        ("bfloat16" or "float32"; None picks bfloat16 on CUDA, or with a reduced-precision GPT on a CPU with native
        bf16); kv_cache_dtype: "auto" or "int8". gpt_options: load_pretrained's (compile, EngineConfig fields).
        device None: CUDA when available, else the CPU. Device and precision are decided here, once, into one
        `Precision` that the engine, the plain path and the audio stage read.
        """
        paths = paths if isinstance(paths, AssetPaths) else AssetPaths.from_root(paths)
        precision = decide_here(dtype, kv_cache_dtype, decode_dtype, device, str(gpt_options.get("backend", "auto")))
        return cls(paths, precision=precision, use_vllm=use_vllm, normalizer=normalizer, gpt_options=gpt_options)

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

    # ---- the stages ------------------------------------------------------------------------------
    def gpt(self, use_vllm: bool | None = None) -> GPTBackend:
        """The GPT backend (None: the one loaded first), loaded on first use; both may live side by side."""
        is_vllm = self.default_use_vllm if use_vllm is None else bool(use_vllm)
        with self._loading:  # two threads asking for a backend not loaded yet load it once
            if is_vllm not in self._gpts:
                self._gpts[is_vllm] = load_pretrained(self.paths, is_vllm=is_vllm, precision=self.precision,
                                                      **self._gpt_options)
        return self._gpts[is_vllm]

    def engine(self) -> LLMEngine:
        """The velocity engine (loaded on first use), for callers that step it themselves (server, Ray)."""
        engine = self.gpt(True).engine
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
        self.gpt(job.use_vllm)  # loaded (or its load failed) before the call waits for its turn
        return self.preparer.start(job, mel, self.pieces(job) if pieces is None else pieces)

    def refined(self, prepared: PreparedJob, token_ids: list[torch.Tensor]) -> PreparedJob:
        """prepared after its pending refine pass (token_ids [T, 1] per prompt): its code requests built."""
        return self.preparer.refined(prepared, token_ids)

    # ---- a shape 'each' job's requests ---------------------------------------------------------------
    def each_requests(self, job: SynthesisJob) -> PerTextRequests:
        """Each text's requests with its own params, in one flat list; a text that cannot be made (no piece, a bad
        speaker) is recorded in PerTextRequests.failed with its ValueError, and the others go on."""
        pieces = self.pieces(job, allow_empty=True)
        check_piece_count(job, pieces)
        self.gpt(job.use_vllm)  # loaded (or its load failed) before the call waits for its turn
        requests = PerTextRequests(pieces, self.mel(job.mel))
        for i, params in enumerate(self.preparer.params(job)):
            try:
                if not pieces.of_text(i).texts:
                    raise empty_text(i)
                requests.add(i, self.code_requests(pieces.of_text(i), params, requests.mel))
            except ValueError as exc:
                requests.failed.append((i, exc))
        return requests

    # ---- use cases: what Chat, the page and the export call ------------------------------------------
    def synthesis(self, job: SynthesisJob, chunking: StreamOptions | None = None,
                  runner: Runner | None = None) -> Synthesis:
        """The job with its verbs (speech/synthesis.py): run() the whole audio, stream() chunks as made (in the
        job's shape), arun()/astream() for an event loop, open() (the server's), each(), cancel(). `runner`: where
        its GPT work runs (None: this pipeline's own GPT backend, one call at a time; texts are checked now)."""
        return Synthesis(self, job, runner or LocalRunner(), chunking)

    def run(self, job: SynthesisJob) -> list[np.ndarray] | list[str]:
        """The whole job: one float32 24 kHz waveform per text (its pieces joined in order), or with `refine_only`
        one refined string per text (synthesis(job).run())."""
        return self.synthesis(job).run()

    def stream(self, job: SynthesisJob, options: StreamOptions | None = None) -> Iterator[list[np.ndarray]]:
        """Audio as the GPT generates it: each yield holds one new (maybe empty) chunk per text; a text's chunks
        concatenate to its run() waveform, its pieces in order (synthesis(job, shape "chunks").stream()). Texts
        are checked now; the call holds the model from its first chunk until the iterator is exhausted or closed."""
        if job.refine_only:
            raise ValueError("refine_only: a stream is audio; refine the texts with run(refine_only=True)")
        return self.synthesis(dataclasses.replace(job, shape="chunks"), options).stream()

    def interrupt(self) -> None:
        """Stop every call in flight (running or waiting for its turn) after its current step; each returns what it
        has. A call made afterwards is not affected."""
        self.gate.interrupt()

    def step_capped(self, params: list[InferCodeParams]) -> list[InferCodeParams]:
        """Each params with the loaded weights' default step cap (step_cap, decided at load) where max_new_token
        was left at InferCodeParams' default; an explicit max_new_token is kept."""
        return step_capped(params, self.step_cap)

    def shutdown(self) -> None:
        """Release the GPT backends' threads and memory; the pipeline is unusable afterwards."""
        for gpt in self._gpts.values():
            gpt.shutdown()
        self._gpts.clear()
