"""Chat: the public spine. text -> normalise -> (refine) -> prompts -> GPT -> decoder -> vocos -> wav.

Drop-in for upstream `ChatTTS.Chat` callers: same method names, parameters and defaults, but one
waveform per input text, no mutation of params, and the velocity engine behind `use_vllm=True`.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import numpy as np
import torch

from . import audio, text
from .assets import AssetPaths, find_assets, is_demo_folder, verify_assets
from .audio.wav import SAMPLE_RATE
from .config import ModelConfig
from .engine.gpt import GPTBackend, load_pretrained
from .params import InferCodeParams, RefineTextParams
from .schema import GenerationOutput, Prompt, SamplingParams, SpeechRequests, TextPieces
from .speech.calls import CallGate, Jobs, Stop

if TYPE_CHECKING:
    from .engine.llm_engine import LLMEngine


class Chat:
    RefineTextParams = RefineTextParams
    InferCodeParams = InferCodeParams

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger("chattts_velocity")
        self.normalizer = text.Normalizer()
        self._gate = CallGate()  # inference calls run one at a time, whichever thread makes them
        self._loading = threading.Lock()
        self._reset_modules()

    def _reset_modules(self) -> None:
        self.paths: AssetPaths | None = None
        self.tokenizer: text.Tokenizer | None = None
        self._gpts: dict[bool, GPTBackend] = {}  # use_vllm -> the backend load_pretrained chose
        self.dvae = self.decoder = self.vocos = None
        self.default_use_vllm, self.dtype, self.decode_dtype = False, "float32", None
        self._load_kwargs: dict = {}
        self.audio_modules: tuple = ()  # (Decoder, DVAE, Vocos) for decode_dtype: bf16 weights cast once, at load

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
        **engine_kwargs,
    ) -> bool:
        """Find, verify and load the assets. `verify=False` is the explicit opt-out for custom weights.

        `decode_dtype` ("bfloat16" or "float32") is the Decoder's and Vocos's precision; None: bfloat16 on CUDA or
        with a bf16/int8 GPT, else exact float32. `kv_cache_dtype` "int8" halves the KV cache's bytes (one fp32
        scale per position and head; the cpu backend with dtype "bfloat16" or "int8" only).

        `coef`, `use_flash_attn` and `experimental` are accepted for upstream compatibility; coef is a
        no-op upstream too (each file's stored coef wins). Extra keyword arguments go to EngineConfig.
        """
        paths = find_assets(source, custom_path, force_redownload)
        if verify and is_demo_folder(paths.root):
            self.logger.warning("%s holds random demo weights (demo-assets): loading it unverified", paths.root)
        elif verify:
            verify_assets(paths)
        device = str(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.paths = paths
        self.device = torch.device(device)
        self._load_kwargs = dict(device=device, dtype=dtype, compile=compile, kv_cache_dtype=kv_cache_dtype,
                                 **engine_kwargs)
        self.tokenizer = text.Tokenizer(paths.tokenizer_dir)
        self.dvae = audio.DVAE.from_state_dict(audio.load_safetensors(paths.dvae)).to(self.device).eval()
        self.decoder = audio.Decoder.from_state_dict(audio.load_safetensors(paths.decoder)).to(self.device).eval()
        self.vocos = audio.Vocos.from_state_dict(audio.load_safetensors(paths.vocos)).to(self.device).eval()
        self.default_use_vllm, self.dtype = use_vllm, dtype
        self.decode_dtype = audio.audio_precision(decode_dtype, dtype, self.device)
        self.audio_modules = audio.cast_for_autocast((self.decoder, self.dvae, self.vocos), self.decode_dtype)
        self.gpt(use_vllm)
        return self.has_loaded()

    def gpt(self, use_vllm: bool | None = None) -> GPTBackend:
        """The GPT stage for use_vllm (None: the one load() chose), loaded on first use; both may live side by side."""
        if self.paths is None:
            raise RuntimeError("Chat: call load() before infer()")
        is_vllm = self.default_use_vllm if use_vllm is None else bool(use_vllm)
        with self._loading:  # two threads asking for a backend not loaded yet load it once
            if is_vllm not in self._gpts:
                self._gpts[is_vllm] = load_pretrained(self.paths, is_vllm=is_vllm, **self._load_kwargs)
        return self._gpts[is_vllm]

    def engine(self) -> LLMEngine:
        """The velocity engine (loaded on first use) for callers that step it themselves: the server, Ray export."""
        return self.gpt(True).engine

    @property
    def config(self) -> ModelConfig:
        """The GPT's dimensions (hidden_size is a speaker vector's width)."""
        return self.gpt().config

    def has_loaded(self, use_decoder: bool = False) -> bool:
        stage = self.decoder if use_decoder else self.dvae
        return all(m is not None for m in (self.tokenizer, self.vocos, stage)) and bool(self._gpts)

    def unload(self) -> None:
        for gpt in self._gpts.values():
            gpt.shutdown()
        self._reset_modules()

    def interrupt(self) -> None:
        """Stop the inference calls in flight now (any thread's, the ones waiting for their turn included) after
        their current step; each returns what it has. A call made afterwards is not affected."""
        self._gate.interrupt()

    # ---- speakers ------------------------------------------------------------------------
    def sample_random_speaker(self, seed: int | None = None) -> str:
        """A random voice (upstream's draw); with `seed`, the voice torch.manual_seed(seed) would give, drawn
        without touching the global RNG (safe while other threads sample)."""
        return text.sample_random_speaker(self.config.hidden_size, device=self.device, seed=seed)

    def sample_audio_speaker(self, wav: np.ndarray | torch.Tensor | str | Path, sample_rate: int = SAMPLE_RATE) -> str:
        """Encode a 24 kHz mono clip (array or audio file path) into an spk_smp string."""
        wav = audio.load_clip(wav, sample_rate, expected_rate=SAMPLE_RATE)
        with torch.inference_mode():
            codes = self.dvae.encode(wav.to(self.device))  # [4, T]
        return text.encode_prompt(codes.cpu())

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
    ):
        """One float32 24 kHz waveform per input text (a str input gives a one-element list).

        Safe to call from several threads: calls take the model one at a time (a stream holds it until it is
        exhausted or closed). Texts are checked (lengths, then normalised content) before the call waits for it.
        """
        gpt, code_params = self.gpt(use_vllm), params_infer_code or InferCodeParams()
        pieces = self.split(text, lang, do_text_normalization, do_homophone_replacement, split_text)
        requests = self.speech_requests(pieces, code_params, use_decoder) if skip_refine_text else None
        refine = params_refine_text or RefineTextParams()
        if stream and not (refine_text_only and not skip_refine_text):
            return self._streamed(gpt, pieces, requests, refine, code_params, use_decoder, max_split_batch)
        with self._gate.call() as stop:
            if requests is None:
                pieces = self._refine(gpt, pieces, refine, max_split_batch, stop)
                if refine_text_only:
                    joined = ["\n".join(g) for g in pieces.group(pieces.texts)]
                    return joined[0] if isinstance(text, str) else joined
                requests = self.speech_requests(pieces, code_params, use_decoder)
            outputs = gpt.generate(requests.prompts, requests.sampling, code_params.show_tqdm, stop,
                                   max_batch=max_split_batch)
            return _join_audio(pieces.group(self._decode(outputs, use_decoder)))

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
    ) -> Iterator[tuple[int, np.ndarray | audio.Spoken | Exception]]:
        """Each text with its own params (voice, seed, ...), all at once; yields (index, wav) as texts finish
        (with `timestamps`, (index, Spoken(wav, each sentence piece's span))).

        A text that cannot be made (a bad speaker, too long, a failure in its generation) yields (index, the
        error) instead, and the others go on. No refine pass. On the velocity engine every piece of every text
        shares the running batch.
        """
        if not isinstance(params, (list, tuple)) or len(params) != len(text.check_texts(texts)):
            raise ValueError(f"params: expected one InferCodeParams per text ({len(texts)})")
        pieces = self.split(texts, lang, do_text_normalization, do_homophone_replacement, split_text,
                            allow_empty=True)
        jobs = Jobs()
        for i, item_params in enumerate(params):
            try:
                if not pieces.of_text(i).texts:
                    raise text.empty_text(i)
                jobs.add(i, self.speech_requests(pieces.of_text(i), item_params, use_decoder))
            except ValueError as exc:
                yield i, exc
        with self._gate.call() as stop:
            for k, output in self.gpt(use_vllm).generate_iter(jobs.prompts, jobs.sampling, progress, stop):
                for i, outputs in jobs.done(k, output):
                    texts = pieces.of_text(i).texts if timestamps else None
                    yield i, outputs if isinstance(outputs, Exception) else self._clip(outputs, use_decoder, texts)

    # ---- text -> requests (public: the server, export and streaming build their requests here) ------------
    def split(self, texts: str | list[str], lang: str | None = None, do_text_normalization: bool = True,
              do_homophone_replacement: bool = True, split_text: bool = True, allow_empty: bool = False) -> TextPieces:
        """Checked texts (lengths first) -> the normalised sentence pieces that hold speech; a text left with none
        is a text.EmptyText naming it (with `allow_empty`, it has no pieces)."""
        return text.normalized_pieces(
            texts, lambda p: self.normalizer(p, do_text_normalization, do_homophone_replacement, lang), split_text,
            allow_empty)

    def speech_requests(self, pieces: TextPieces, params: InferCodeParams | list[InferCodeParams],
                        use_decoder: bool = True) -> SpeechRequests:
        """One audio-code request per piece; params is one InferCodeParams for all texts or one per text."""
        per_text = params if isinstance(params, list) else [params] * pieces.num_texts
        if len(per_text) != pieces.num_texts:
            raise ValueError(f"params: got {len(per_text)} InferCodeParams for {pieces.num_texts} texts")
        eos = self.config.audio_eos_id
        prompts = [self._code_prompt(p, per_text[i]) for p, i in zip(pieces.texts, pieces.owner)]
        sampling = [per_text[i].to_sampling_params("code", eos, use_decoder) for i in pieces.owner]
        return SpeechRequests(pieces, prompts, sampling)

    def _code_prompt(self, piece: str, params: InferCodeParams) -> Prompt:
        spk_emb = text.speaker_tensor(params.spk_emb, self.config.hidden_size)
        spk_smp = text.decode_prompt(params.spk_smp) if params.spk_smp is not None else None
        return self.tokenizer.code_prompt(piece, spk_emb, params.txt_smp, params.prompt, spk_smp)

    def refine_requests(self, pieces: TextPieces, params: RefineTextParams) -> tuple[list[Prompt], SamplingParams]:
        """The refine-text pass's requests, one per piece (for callers that run the engine themselves)."""
        prompts = [self.tokenizer.refine_prompt(p, params.prompt) for p in pieces.texts]
        return prompts, params.to_sampling_params("text", self.tokenizer.eos_id, return_hidden=False)

    def refined_text(self, token_ids: torch.Tensor) -> str:
        """A refine request's generated ids [T, 1] -> the text the code pass reads."""
        return self.tokenizer.refined_text(token_ids[:, 0].tolist())

    def _refine(self, gpt: GPTBackend, pieces: TextPieces, params: RefineTextParams, batch: int,
                stop: Stop) -> TextPieces:
        prompts, sampling = self.refine_requests(pieces, params)
        outs = gpt.generate(prompts, sampling, params.show_tqdm, stop, max_batch=batch)
        return pieces.replace([self.refined_text(o.token_ids) for o in outs])

    # ---- GPT outputs -> audio ------------------------------------------------------------------------
    def _decode(self, outputs: list[GenerationOutput], use_decoder: bool) -> list[np.ndarray]:
        decoder, dvae, vocos = self.audio_modules
        if use_decoder:
            return audio.decode_hidden_batch(decoder, vocos, [o.hidden for o in outputs], self.decode_dtype)
        return audio.decode_codes_batch(dvae, vocos, [o.token_ids for o in outputs], self.decode_dtype)

    def _clip(self, outputs: list[GenerationOutput], use_decoder: bool, texts: list[str] | None):
        """One text's pieces -> its waveform (and, given the piece texts, a Spoken with their timestamps)."""
        waves = self._decode(outputs, use_decoder)
        wav = np.concatenate(waves).astype(np.float32)
        return wav if texts is None else audio.Spoken(wav, audio.piece_timestamps(texts, [len(w) for w in waves]))

    def _streamed(self, gpt: GPTBackend, pieces: TextPieces, requests: SpeechRequests | None,
                  refine: RefineTextParams, code_params: InferCodeParams, use_decoder: bool,
                  batch: int) -> Iterator[list[np.ndarray]]:
        """Audio as the GPT generates it: each yield holds one new (maybe empty) chunk per text.

        A text's chunks concatenate to its non-stream waveform; its pieces play in order. The decoder
        sees stream_batch new steps per chunk plus exact context on both sides (audio/streaming.py).
        The call holds the model from its first chunk until it is exhausted or closed.
        """
        from .speech import StreamOptions, StreamSet, stream_texts

        with self._gate.call() as stop:
            if requests is None:
                pieces = self._refine(gpt, pieces, refine, batch, stop)
                requests = self.speech_requests(pieces, code_params, use_decoder)
            options = StreamOptions(chunk_steps=code_params.stream_batch)
            streams = StreamSet(*self.audio_modules, options, self.decode_dtype)
            yield from stream_texts(streams, gpt, requests, use_decoder, stop)


def _join_audio(groups: list[list[np.ndarray]]) -> list[np.ndarray]:
    return [np.concatenate(g).astype(np.float32) if g else np.zeros(0, np.float32) for g in groups]
