"""Chat: upstream ChatTTS's facade over the speech pipeline (speech/pipeline.py).

Drop-in for upstream `ChatTTS.Chat` callers: same method names, parameters and defaults, but one
waveform per input text, no mutation of params, and the velocity engine behind `use_vllm=True`.
Everything below turns upstream's arguments into one SynthesisJob (`use_decoder` into a mel source, `use_vllm` into
the job's GPT path) and runs it through the pipeline: `synthesis(job).run()`, `.stream()` or `.each()`
(speech/synthesis.py), which take the model one call at a time, from any thread. The low-level upstream steps
(`split`, `speech_requests`, `gpt`, `engine`) read the pipeline's stages.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import torch

from .assets import find_assets, is_demo_folder, verify_assets
from .audio import Spoken
from .audio.wav import SAMPLE_RATE
from .config import ModelConfig
from .engine.gpt import GPTBackend
from .engine.llm_engine import LLMEngine
from .params import InferCodeParams, RefineTextParams
from .schema import SpeechRequests, TextPieces
from .speech import MelSource, SpeechPipeline
from .speech.job import SynthesisJob, TextOptions
from .text import Normalizer, Tokenizer, check_texts


class Chat:
    RefineTextParams: TypeAlias = RefineTextParams
    InferCodeParams: TypeAlias = InferCodeParams

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger("chattts_velocity")
        self.normalizer = Normalizer()  # register a language's normaliser here, before or after load()
        self._pipeline: SpeechPipeline | None = None

    # ---- loading -------------------------------------------------------------------------
    def load(
        self,
        source: str = "local",
        force_redownload: bool = False,
        compile: bool = False,
        custom_path: str | Path | None = None,
        device: str | torch.device | None = None,
        coef: str | None = None,
        use_flash_attn: bool = False,
        use_vllm: bool = False,
        experimental: bool = False,
        verify: bool = True,
        dtype: str = "float32",
        decode_dtype: str | None = None,
        kv_cache_dtype: str = "auto",
        **engine_kwargs: object,
    ) -> bool:
        """Find, verify and load the assets. `verify=False` is the explicit opt-out for custom weights.

        `dtype` "auto" is the fastest accepted precision here (the CLI's `--dtype auto`: int8 where our CPU kernels
        run, bfloat16 on CUDA, else float32); the default "float32" is exact.
        `decode_dtype` ("bfloat16" or "float32") is the Decoder's and Vocos's precision; None: bfloat16 on CUDA, or
        with a bf16/int8/int4 GPT on a CPU with native bf16 (AVX-512 BF16, AMX), else exact float32.
        `kv_cache_dtype` "int8" halves the KV cache's bytes (one fp32 scale per position and head; the cpu backend
        with dtype "bfloat16" or "int8" only).

        `coef`, `use_flash_attn` and `experimental` are accepted for upstream compatibility; coef is a
        no-op upstream too (each file's stored coef wins). Extra keyword arguments go to EngineConfig.
        On demo weights (random, they rarely stop by themselves) an InferCodeParams left at the default
        max_new_token stops each sentence at the CLI's demo cap (demo.default_max_new_token).
        """
        paths = find_assets(source, custom_path, force_redownload)
        if verify and is_demo_folder(paths.root):
            self.logger.warning("%s holds random demo weights (demo-assets): loading it unverified", paths.root)
        elif verify:
            verify_assets(paths)
        self._pipeline = SpeechPipeline.load(
            paths, device=device, gpt=_gpt_name(use_vllm), dtype=dtype, decode_dtype=decode_dtype,
            normalizer=self.normalizer, compile=compile, kv_cache_dtype=kv_cache_dtype, **engine_kwargs)
        return self.has_loaded()

    @property
    def pipeline(self) -> SpeechPipeline:
        """The loaded speech pipeline (what the server, the export and the web UI share)."""
        if self._pipeline is None:
            raise RuntimeError("Chat: call load() before infer()")
        return self._pipeline

    def gpt(self, use_vllm: bool | None = None) -> GPTBackend:
        """The GPT stage for use_vllm (None: the one load() chose), loaded on first use; both may live side by side."""
        return self.pipeline.stages.gpt(None if use_vllm is None else _gpt_name(use_vllm))

    def engine(self) -> LLMEngine:
        """The velocity engine (loaded on first use) for callers that step it themselves: the server, Ray export."""
        return self.pipeline.stages.engine()

    @property
    def config(self) -> ModelConfig:
        """The GPT's dimensions (hidden_size is a speaker vector's width)."""
        return self.pipeline.config

    # the loaded stages, None before load() (upstream's attributes)
    paths = property(lambda self: self._loaded("paths"))
    device = property(lambda self: self._loaded("device"))
    dtype = property(lambda self: self._loaded("dtype", "float32"))
    decode_dtype = property(lambda self: self._loaded("decode_dtype"))
    dvae = property(lambda self: self._stage("dvae"))
    decoder = property(lambda self: self._stage("decoder"))
    vocos = property(lambda self: self._stage("vocos"))

    @property
    def default_use_vllm(self) -> bool:
        """Whether load() chose the velocity engine (upstream's flag)."""
        return self._pipeline is not None and self._pipeline.stages.default_gpt == "velocity"

    @property
    def tokenizer(self) -> Tokenizer | None:
        return None if self._pipeline is None else self._pipeline.stages.frontend.tokenizer

    def step_capped(self, params: InferCodeParams) -> InferCodeParams:
        """params with the loaded weights' default step cap (Stages.step_capped)."""
        return self.pipeline.stages.step_capped([params])[0]

    def _loaded(self, name: str, default: object = None) -> object:
        return default if self._pipeline is None else getattr(self._pipeline, name)

    def _stage(self, name: str) -> object:
        return None if self._pipeline is None else getattr(self._pipeline.stages, name)

    def has_loaded(self, use_decoder: bool = False) -> bool:
        return self._pipeline is not None and self._mel(use_decoder).model is not None

    def unload(self) -> None:
        if self._pipeline is not None:
            self._pipeline.shutdown()
        self._pipeline = None

    def interrupt(self) -> None:
        """Stop the inference calls in flight now (any thread's, the ones waiting for their turn included) after
        their current step; each returns what it has. A call made afterwards is not affected."""
        if self._pipeline is not None:
            self._pipeline.interrupt()

    # ---- speakers ------------------------------------------------------------------------
    def sample_random_speaker(self, seed: int | None = None) -> str:
        """A random voice (upstream's draw); with `seed`, the voice torch.manual_seed(seed) would give, drawn
        without touching the global RNG (safe while other threads sample)."""
        return self.pipeline.speakers.random(seed)

    def sample_audio_speaker(self, wav: np.ndarray | torch.Tensor | str | Path, sample_rate: int = SAMPLE_RATE) -> str:
        """Encode a 24 kHz mono clip (array or audio file path) into an spk_smp string."""
        return self.pipeline.speakers.from_audio(wav, sample_rate)

    # ---- inference -----------------------------------------------------------------------
    def infer(
        self,
        text: str | list[str],
        stream: bool = False,
        lang: str | None = None,
        skip_refine_text: bool = False,
        refine_text_only: bool = False,
        use_decoder: bool = True,
        do_text_normalization: bool = True,
        do_homophone_replacement: bool = True,
        split_text: bool = True,
        max_split_batch: int = 4,
        params_refine_text: RefineTextParams | None = None,
        params_infer_code: InferCodeParams | None = None,
        use_vllm: bool | None = None,
    ) -> Any:  # as upstream's: waveforms, or a stream of chunks, or the refined text(s), by the flags
        """One float32 24 kHz waveform per input text (a str input gives a one-element list).

        Safe to call from several threads: calls take the model one at a time (a stream holds it until it is
        exhausted or closed). Texts are checked (lengths, then normalised content) before the call waits for it.
        """
        refine = None if skip_refine_text else params_refine_text or RefineTextParams()
        job = SynthesisJob(text if isinstance(text, list) else [text], params_infer_code or InferCodeParams(),
                           mel=_mel_name(use_decoder), refine=refine, refine_only=refine_text_only and bool(refine),
                           text=TextOptions(lang, do_text_normalization, do_homophone_replacement, split_text),
                           gpt=None if use_vllm is None else _gpt_name(use_vllm), max_batch=max_split_batch)
        if stream and not job.refine_only:
            return self.pipeline.synthesis(dataclasses.replace(job, shape="chunks")).stream()
        out = self.pipeline.synthesis(job).run()
        return out[0] if job.refine_only and isinstance(text, str) else out

    def infer_many(
        self,
        texts: list[str],
        params: list[InferCodeParams],
        use_decoder: bool = True,
        lang: str | None = None,
        do_text_normalization: bool = True,
        do_homophone_replacement: bool = True,
        split_text: bool = True,
        use_vllm: bool | None = None,
        progress: bool = False,
        timestamps: bool = False,
    ) -> Iterator[tuple[int, np.ndarray | Spoken | Exception]]:
        """Each text with its own params (voice, seed, ...), all at once; yields (index, wav) as texts finish
        (with `timestamps`, (index, Spoken(wav, each sentence piece's span))).

        A text that cannot be made (a bad speaker, too long, a failure in its generation) yields (index, the
        error) instead, and the others go on. No refine pass. On the velocity engine every piece of every text
        shares the running batch.
        """
        if not isinstance(params, (list, tuple)) or len(params) != len(check_texts(texts)):
            raise ValueError(f"params: expected one InferCodeParams per text ({len(texts)})")
        job = SynthesisJob(list(texts), list(params), mel=_mel_name(use_decoder),
                           text=TextOptions(lang, do_text_normalization, do_homophone_replacement, split_text),
                           gpt=None if use_vllm is None else _gpt_name(use_vllm), progress=progress,
                           timestamps=timestamps, shape="each")
        yield from self.pipeline.synthesis(job).each()

    # ---- text -> requests, in upstream's argument names (the pipeline's front end does the work) ------------
    def split(self, texts: str | list[str], lang: str | None = None, do_text_normalization: bool = True,
              do_homophone_replacement: bool = True, split_text: bool = True, allow_empty: bool = False) -> TextPieces:
        """Checked texts (lengths first) -> the normalised sentence pieces that hold speech (TextFrontEnd.pieces)."""
        return self.pipeline.stages.frontend.pieces(texts, lang=lang, normalize=do_text_normalization,
                                                    homophones=do_homophone_replacement, split=split_text,
                                                    allow_empty=allow_empty)

    def speech_requests(self, pieces: TextPieces, params: InferCodeParams | list[InferCodeParams],
                        use_decoder: bool = True) -> SpeechRequests:
        """One audio-code request per piece; params is one InferCodeParams for all texts or one per text."""
        return self.pipeline.stages.code_requests(pieces, params, self._mel(use_decoder))

    def _mel(self, use_decoder: bool) -> MelSource:
        """Upstream's flag as the pipeline's mel source (the one place inside the package that reads it)."""
        return self.pipeline.stages.mel(_mel_name(use_decoder))


def _mel_name(use_decoder: bool) -> str:
    """Upstream's flag as the pipeline's mel source name (the one place inside the package that reads it)."""
    return "decoder" if use_decoder else "dvae"


def _gpt_name(use_vllm: bool) -> str:
    """Upstream's flag as the job's GPT path (the one place inside the package that reads it)."""
    return "velocity" if use_vllm else "plain"


def pipeline_of(speech: Chat | SpeechPipeline) -> SpeechPipeline:
    """The pipeline behind what the server and the export accept: a loaded Chat's, or the pipeline itself."""
    return speech.pipeline if isinstance(speech, Chat) else speech
