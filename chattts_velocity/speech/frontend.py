"""The text front end: user texts and params -> the refine and code passes' GPT requests.

It holds the normaliser and tokenizer and is the one place that checks a speaker against the GPT (its width must
be the hidden size) and a prompt's control tokens (text/controls.py); each request's voice is decoded once, however
many sentence pieces its text splits into.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..params import InferCodeParams, RefineTextParams
from ..schema import Prompt, SamplingParams, SpeechRequests, TextPieces
from ..text import Normalizer, Tokenizer, decode_prompt, normalized_pieces, speaker_tensor
from ..text.controls import check_controls
from ..text.normalizer import warn_dropped


@dataclass(frozen=True)
class SpeakerPrompt:
    """A request's voice, decoded and checked once; every piece's code prompt reads it."""

    spk_emb: torch.Tensor | None  # [H] the speaker vector as given (normalised into each Prompt)
    spk_smp: torch.Tensor | None  # [4, P] the voice sample's codes
    txt_smp: str | None  # the voice sample's transcript


class TextFrontEnd:
    """Normaliser + tokenizer + the speaker and control checks, for a GPT of `hidden_size`."""

    def __init__(self, tokenizer: Tokenizer, hidden_size: int, audio_eos_id: int,
                 normalizer: Normalizer | None = None) -> None:
        self.tokenizer, self.hidden_size, self.audio_eos_id = tokenizer, hidden_size, audio_eos_id
        self.normalizer = normalizer or Normalizer()

    def pieces(self, texts: str | list[str], *, lang: str | None = None, normalize: bool = True,
               homophones: bool = True, split: bool = True, allow_empty: bool = False) -> TextPieces:
        """Checked texts (lengths first) -> the normalised sentence pieces that hold speech; a text left with none
        is a text.EmptyText naming it (with `allow_empty`, it has no pieces)."""
        dropped: set[str] = set()  # named once for all the texts' sentences, not once per sentence
        try:
            return normalized_pieces(texts, lambda p: self.normalizer(p, normalize, homophones, lang, dropped=dropped),
                                     split, allow_empty)
        finally:
            warn_dropped(dropped)

    def speaker(self, spk_emb: str | torch.Tensor | None, field: str = "spk_emb") -> torch.Tensor | None:
        """A speaker string or vector -> [hidden_size], checked against this GPT; a ValueError naming `field`."""
        return speaker_tensor(spk_emb, self.hidden_size, field)

    def voice(self, params: InferCodeParams) -> SpeakerPrompt:
        """params' speaker, voice sample and transcript, decoded and checked (once per request)."""
        spk_smp = decode_prompt(params.spk_smp) if isinstance(params.spk_smp, str) else params.spk_smp
        return SpeakerPrompt(self.speaker(params.spk_emb), spk_smp, params.txt_smp)

    def code_requests(self, pieces: TextPieces, params: InferCodeParams | list[InferCodeParams], *,
                      return_hidden: bool) -> SpeechRequests:
        """One audio-code request per piece; params is one InferCodeParams for all texts or one per text.
        return_hidden: what the mel source reads (MelSource.return_hidden)."""
        per_text = params if isinstance(params, list) else [params] * pieces.num_texts
        if len(per_text) != pieces.num_texts:
            raise ValueError(f"params: got {len(per_text)} InferCodeParams for {pieces.num_texts} texts")
        voices: dict[int, SpeakerPrompt] = {}
        sampling: dict[int, SamplingParams] = {}
        for p in per_text:
            if id(p) not in voices:
                check_controls(p.prompt)
                voices[id(p)] = self.voice(p)
                sampling[id(p)] = p.to_sampling_params("code", self.audio_eos_id, return_hidden)
        prompts = [self._code_prompt(piece, per_text[i], voices[id(per_text[i])])
                   for piece, i in zip(pieces.texts, pieces.owner, strict=True)]
        return SpeechRequests(pieces, prompts, [sampling[id(per_text[i])] for i in pieces.owner])

    def _code_prompt(self, piece: str, params: InferCodeParams, voice: SpeakerPrompt) -> Prompt:
        return self.tokenizer.code_prompt(piece, voice.spk_emb, voice.txt_smp, params.prompt, voice.spk_smp)

    def refine_requests(self, pieces: TextPieces, params: RefineTextParams) -> tuple[list[Prompt], SamplingParams]:
        """The refine-text pass's requests: one prompt per piece, one SamplingParams for all."""
        check_controls(params.prompt)
        prompts = [self.tokenizer.refine_prompt(p, params.prompt) for p in pieces.texts]
        return prompts, params.to_sampling_params("text", self.tokenizer.eos_id, return_hidden=False)

    def refined_text(self, token_ids: torch.Tensor) -> str:
        """A refine request's generated ids [T, 1] -> the text the code pass reads."""
        return self.tokenizer.refined_text(token_ids[:, 0].tolist())
