"""Text stage: prompt building. Text (+ speaker, + voice sample) -> schema.Prompt; ids -> text.

Wraps the official BERT tokenizer (asset/tokenizer) and lays prompts out as upstream does
(right-aligned batches; the refine and code phases below: the model was trained on exactly these layouts).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from chattts_velocity.schema import CODE_PROMPT, Prompt
from chattts_velocity.text.speaker import decode_prompt, decode_spk_emb, normalize_spk_emb

_STRIPPED_TAGS = ("[Stts]", "[spk_emb]", "[empty_spk]")  # removed from user text before wrapping


class Tokenizer:
    """The ChatTTS tokenizer (21178 ids) plus upstream's prompt decoration."""

    def __init__(self, folder: str | Path, num_vq: int = 4) -> None:
        folder = Path(folder)
        if not (folder / "tokenizer.json").is_file():
            raise FileNotFoundError(f"tokenizer: {folder} has no tokenizer.json (expected asset/tokenizer)")
        # NOTE: tokenizers warns (and may deadlock) when a process forks after using it in parallel.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from transformers import BertTokenizerFast  # type: ignore[attr-defined]  # exported lazily, not in its stubs

        self._tok = BertTokenizerFast.from_pretrained(str(folder))
        self.num_vq = num_vq
        self.spk_emb_id = self._special_id("[spk_emb]")
        self.break_0_id = self._special_id("[break_0]")
        self.eos_id = self._special_id("[Ebreak]")  # EOS of the refine-text phase

    def _special_id(self, token: str) -> int:
        idx = self._tok.convert_tokens_to_ids(token)
        if idx is None or idx == self._tok.unk_token_id:
            raise ValueError(f"tokenizer: the vocabulary has no {token} token; is this the ChatTTS tokenizer?")
        return int(idx)

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`: no [CLS]/[SEP], no truncation (a 600-token text stays 600)."""
        if not isinstance(text, str):
            raise ValueError(f"text: expected a str, got {type(text).__name__}")
        ids: list[int] = self._tok(text, add_special_tokens=False, truncation=False, padding=False)["input_ids"]
        return ids

    def decode(self, ids: list[int] | torch.Tensor) -> str:
        """Ids -> text with special tokens kept and tokens space-separated ("[Sbreak] 你 好 ...")."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        text: str = self._tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=None)
        return text

    def refined_text(self, ids: list[int] | torch.Tensor) -> str:
        """Refine-phase output ids (EOS excluded) -> code-phase text: drops [break_k] and later ids."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return self.decode([i for i in ids if i < self.break_0_id])

    def refine_prompt(self, text: str, prompt: str = "") -> Prompt:
        """Refine-text phase: "[Sbreak]" + text + "[Pbreak]" + prompt ; no speaker."""
        input_ids, text_mask = self._text_rows(f"[Sbreak]{text}[Pbreak]{prompt}")
        return Prompt(input_ids=input_ids, text_mask=text_mask)

    def code_prompt(
        self,
        text: str,
        spk_emb: torch.Tensor | str | None = None,
        txt_smp: str | None = None,
        prompt: str = CODE_PROMPT,
        spk_smp: torch.Tensor | str | None = None,
    ) -> Prompt:
        """Code phase: [Stts][spk_emb|empty_spk] txt_smp prompt text [Ptts] <spk_smp codes>.

        spk_emb: speaker vector [D] or speaker string; it is normalised here (speaker.normalize_spk_emb).
        spk_smp: voice-sample codes [num_vq, P] or their string; appended after [Ptts] as audio rows.
        """
        if not isinstance(text, str):
            raise ValueError(f"text: expected a str, got {type(text).__name__}")
        for tag in _STRIPPED_TAGS:
            text = text.replace(tag, "")
        text = prompt + text.strip() if prompt else text.strip()
        speaker_tag = "[empty_spk]" if spk_emb is None else "[spk_emb]"
        input_ids, text_mask = self._text_rows(f"[Stts]{speaker_tag}{txt_smp or ''}{text}[Ptts]")
        if spk_smp is not None:
            input_ids, text_mask = self._append_codes(input_ids, text_mask, spk_smp)
        if spk_emb is None:
            return Prompt(input_ids=input_ids, text_mask=text_mask)
        vector = decode_spk_emb(spk_emb) if isinstance(spk_emb, str) else spk_emb
        positions = (input_ids[:, 0] == self.spk_emb_id).nonzero()[:, 0].tolist()
        return Prompt(input_ids, text_mask, spk_emb=normalize_spk_emb(vector), spk_positions=tuple(positions))

    def _text_rows(self, text: str) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.tensor(self.encode(text), dtype=torch.int64)  # [T]
        input_ids = ids.unsqueeze(-1).expand(-1, self.num_vq).contiguous()  # [T, num_vq]
        return input_ids, torch.ones(len(ids), dtype=torch.bool)

    def _append_codes(
        self, input_ids: torch.Tensor, text_mask: torch.Tensor, spk_smp: torch.Tensor | str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        codes = decode_prompt(spk_smp) if isinstance(spk_smp, str) else spk_smp  # [num_vq, P]
        ok = isinstance(codes, torch.Tensor) and not codes.is_floating_point() and codes.dim() == 2
        if not ok or codes.shape[0] != self.num_vq:
            got = tuple(codes.shape) if isinstance(codes, torch.Tensor) else type(codes).__name__
            raise ValueError(f"spk_smp: expected integer codes [{self.num_vq}, P], got {got}")
        audio = codes.t().to(torch.int64)  # [P, num_vq]; channel q = codebook q
        no_text = torch.zeros(len(audio), dtype=torch.bool)
        return torch.cat([input_ids, audio]), torch.cat([text_mask, no_text])
