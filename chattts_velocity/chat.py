"""Chat: the public spine. text -> normalise -> (refine) -> prompts -> GPT -> decoder -> vocos -> wav.

Drop-in for upstream `ChatTTS.Chat` callers: same method names, parameters and defaults, but one
waveform per input text, no mutation of params, and the velocity engine behind `use_vllm=True`.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from . import audio, text
from .assets import AssetPaths, find_assets, verify_assets
from .engine.gpt import load_pretrained
from .params import InferCodeParams, RefineTextParams
from .schema import GenerationOutput, Prompt

SAMPLE_RATE = 24000


class Chat:
    RefineTextParams = RefineTextParams
    InferCodeParams = InferCodeParams

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger("chattts_velocity")
        self.normalizer = text.Normalizer()
        self._stop = threading.Event()
        self._reset_modules()

    def _reset_modules(self) -> None:
        self.paths: AssetPaths | None = None
        self.tokenizer: text.Tokenizer | None = None
        self.gpts: dict[bool, object] = {}  # is_vllm -> PlainGPT | LLM
        self.dvae = self.decoder = self.vocos = None
        self.default_use_vllm = False
        self._load_kwargs: dict = {}

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
        **engine_kwargs,
    ) -> bool:
        """Find, verify and load the assets. `verify=False` is the explicit opt-out for custom weights.

        `coef`, `use_flash_attn` and `experimental` are accepted for upstream compatibility; coef is a
        no-op upstream too (each file's stored coef wins). Extra keyword arguments go to EngineConfig.
        """
        paths = find_assets(source, custom_path, force_redownload)
        if verify:
            verify_assets(paths)
        device = str(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.paths = paths
        self.device = torch.device(device)
        self._load_kwargs = dict(device=device, dtype=dtype, compile=compile, **engine_kwargs)
        self.tokenizer = text.Tokenizer(paths.tokenizer_dir)
        self.dvae = audio.DVAE.from_state_dict(audio.load_safetensors(paths.dvae)).to(self.device).eval()
        self.decoder = audio.Decoder.from_state_dict(audio.load_safetensors(paths.decoder)).to(self.device).eval()
        self.vocos = audio.Vocos.from_state_dict(audio.load_safetensors(paths.vocos)).to(self.device).eval()
        self.default_use_vllm = use_vllm
        self._gpt(use_vllm)
        return self.has_loaded()

    def _gpt(self, use_vllm: bool | None):
        """The GPT backend for this call, loaded on first use (both may live side by side)."""
        if self.paths is None:
            raise RuntimeError("Chat: call load() before infer()")
        is_vllm = self.default_use_vllm if use_vllm is None else bool(use_vllm)
        if is_vllm not in self.gpts:
            self.gpts[is_vllm] = load_pretrained(self.paths, is_vllm=is_vllm, **self._load_kwargs)
        return self.gpts[is_vllm]

    def has_loaded(self, use_decoder: bool = False) -> bool:
        stage = self.decoder if use_decoder else self.dvae
        return all(m is not None for m in (self.tokenizer, self.vocos, stage)) and bool(self.gpts)

    def unload(self) -> None:
        for gpt in self.gpts.values():
            getattr(gpt, "shutdown", lambda: None)()
        self._reset_modules()

    def interrupt(self) -> None:
        """Stop the running infer() after the current step; it returns what it has."""
        self._stop.set()

    # ---- speakers ------------------------------------------------------------------------
    def sample_random_speaker(self) -> str:
        hidden = self._gpt(None).config.hidden_size
        return text.sample_random_speaker(hidden, device=self.device)

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
        """One float32 24 kHz waveform per input text (a str input gives a one-element list)."""
        self._stop.clear()
        texts = _check_texts(text)
        refine_params = params_refine_text or RefineTextParams()
        code_params = params_infer_code or InferCodeParams()
        gpt = self._gpt(use_vllm)
        pieces, owner = _split(texts, split_text)
        pieces = [self.normalizer(p, do_text_normalization, do_homophone_replacement, lang) for p in pieces]
        if not skip_refine_text:
            pieces = self._refine(gpt, pieces, refine_params, max_split_batch)
            if refine_text_only:
                joined = _join_per_text(pieces, owner, len(texts), "\n")
                return joined[0] if isinstance(text, str) else joined
        if stream:
            return self._stream_results(gpt, pieces, owner, len(texts), code_params, use_decoder)
        outputs = self._infer_code(gpt, pieces, code_params, use_decoder, max_split_batch)
        wavs = self._decode(outputs, use_decoder)
        return _join_per_text(wavs, owner, len(texts), None)

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
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Each text with its own params (voice, seed, ...), all at once; yields (index, wav) as texts finish.

        No refine pass. On the velocity engine every piece of every text shares the running batch.
        """
        texts = _check_texts(texts)
        if len(params) != len(texts):
            raise ValueError(f"params: got {len(params)} InferCodeParams for {len(texts)} texts")
        self._stop.clear()
        gpt = self._gpt(use_vllm)
        pieces, owner = _split(texts, split_text)
        pieces = [self.normalizer(p, do_text_normalization, do_homophone_replacement, lang) for p in pieces]
        prompts = [self._code_prompt(p, params[i]) for p, i in zip(pieces, owner)]
        sampling = [params[i].to_sampling_params("code", gpt.config.audio_eos_id, use_decoder) for i in owner]
        pending = {i: owner.count(i) for i in set(owner)}
        done: dict[int, list] = {i: [None] * n for i, n in pending.items()}
        slot = [owner[:k].count(owner[k]) for k in range(len(owner))]
        for k, output in _generate_each(gpt, prompts, sampling, progress, self._stop.is_set):
            i = owner[k]
            done[i][slot[k]] = output
            pending[i] -= 1
            if pending[i] == 0:
                yield i, np.concatenate(self._decode(done.pop(i), use_decoder)).astype(np.float32)

    def _code_prompt(self, piece: str, params: InferCodeParams) -> Prompt:
        spk_emb = _speaker_tensor(params.spk_emb)
        hidden = self._gpt(None).config.hidden_size
        if spk_emb is not None and spk_emb.shape[0] != hidden:
            raise ValueError(f"spk_emb: this speaker has {spk_emb.shape[0]} values but the model needs "
                             f"{hidden}; sample it with this model's sample_random_speaker()")
        spk_smp = text.decode_prompt(params.spk_smp) if params.spk_smp is not None else None
        return self.tokenizer.code_prompt(piece, spk_emb, params.txt_smp, params.prompt, spk_smp)

    def _refine(self, gpt, pieces: list[str], params: RefineTextParams, batch: int) -> list[str]:
        prompts = [self.tokenizer.refine_prompt(p, params.prompt) for p in pieces]
        eos = self.tokenizer.eos_id
        sampling = params.to_sampling_params("text", eos, return_hidden=False)
        outs = self._generate(gpt, prompts, sampling, batch, params.show_tqdm)
        return [self.tokenizer.refined_text(o.token_ids[:, 0].tolist()) for o in outs]

    def _infer_code(self, gpt, pieces: list[str], params: InferCodeParams, use_decoder: bool, batch: int):
        prompts = [self._code_prompt(p, params) for p in pieces]
        eos = gpt.config.audio_eos_id
        sampling = params.to_sampling_params("code", eos, return_hidden=use_decoder)
        return self._generate(gpt, prompts, sampling, batch, params.show_tqdm)

    def _generate(self, gpt, prompts: list[Prompt], sampling, batch: int, progress: bool) -> list[GenerationOutput]:
        if not prompts:
            return []
        # The plain path keeps upstream's batching (max_split_batch texts per padded batch);
        # the engine batches everything continuously on its own.
        size = len(prompts) if getattr(gpt, "is_vllm", False) else max(1, batch)
        outputs: list[GenerationOutput] = []
        for start in range(0, len(prompts), size):
            chunk = prompts[start : start + size]
            outputs += gpt.generate(chunk, sampling, progress=progress, should_stop=self._stop.is_set)
        return outputs

    def _decode(self, outputs: list[GenerationOutput], use_decoder: bool) -> list[np.ndarray]:
        with torch.inference_mode():
            if use_decoder:
                return audio.decode_hidden_batch(self.decoder, self.vocos, [o.hidden for o in outputs])
            return audio.decode_codes_batch(self.dvae, self.vocos, [o.token_ids for o in outputs])

    def _stream_results(self, gpt, pieces: list[str], owner: list[int], num_texts: int, params: InferCodeParams,
                        use_decoder: bool) -> Iterator[list[np.ndarray]]:
        """Audio as the engine generates it: each yield holds one new (maybe empty) chunk per text.

        A text's chunks concatenate to its non-stream waveform; its pieces play in order. The decoder
        sees params.stream_batch new steps per chunk plus exact context on both sides (audio/streaming.py).
        """
        from . import speech

        prompts = [self._code_prompt(p, params) for p in pieces]
        sampling = params.to_sampling_params("code", gpt.config.audio_eos_id, use_decoder)
        options = speech.StreamOptions(chunk_steps=params.stream_batch)
        return speech.stream_texts(self, gpt, prompts, [sampling] * len(prompts), owner, num_texts, use_decoder,
                                   options, self._stop.is_set)


def _generate_each(gpt, prompts, sampling, progress, should_stop) -> Iterator[tuple[int, GenerationOutput]]:
    """(index, output) as requests finish: all at once on the engine, one by one on the plain path."""
    if getattr(gpt, "is_vllm", False):
        yield from gpt.generate_iter(prompts, sampling, progress=progress, should_stop=should_stop)
        return
    for k, (prompt, params) in enumerate(zip(prompts, sampling)):
        yield k, gpt.generate([prompt], params, progress=progress, should_stop=should_stop)[0]


def _check_texts(value) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, (list, tuple)) or len(texts) == 0:
        raise ValueError("text: expected a non-empty string or a non-empty list of strings")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ValueError(f"text[{i}]: expected a string, got {type(t).__name__}")
        if not t.strip():
            raise ValueError(f"text[{i}]: is empty; every text needs something to say")
    return list(texts)


def _split(texts: list[str], split_text: bool) -> tuple[list[str], list[int]]:
    """Sentence pieces and, for each piece, the index of the text it came from."""
    pieces, owner = [], []
    for i, t in enumerate(texts):
        parts = text.split_text(t) if split_text else [t]
        pieces += parts or [t]
        owner += [i] * (len(parts) or 1)
    return pieces, owner


def _join_per_text(items: list, owner: list[int], num_texts: int, sep: str | None) -> list:
    grouped: list[list] = [[] for _ in range(num_texts)]
    for item, i in zip(items, owner):
        grouped[i].append(item)
    if sep is not None:
        return [sep.join(g) for g in grouped]
    return [np.concatenate(g).astype(np.float32) if g else np.zeros(0, np.float32) for g in grouped]


def _speaker_tensor(spk_emb) -> torch.Tensor | None:
    if spk_emb is None:
        return None
    if isinstance(spk_emb, str):
        return text.decode_spk_emb(spk_emb)
    if isinstance(spk_emb, torch.Tensor) and spk_emb.dim() == 1:
        return spk_emb
    raise ValueError("spk_emb: expected a speaker string from sample_random_speaker() or a 1-D tensor")
