"""Demo checkpoint: the `asset/tokenizer` folder (copied from a real one, or a compatible generated one).

In: a target folder and an optional source folder. Out: tokenizer.json, tokenizer_config.json and
special_tokens_map.json that BertTokenizerFast loads with len 21178 and the official special ids.
"""
from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from chattts_velocity.text.controls import CONTROL_LEVELS, control_token

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TOKENIZER_FILES = ("special_tokens_map.json", "tokenizer_config.json", "tokenizer.json")
BASE_VOCAB_SIZE = 21128  # the bert-base-chinese WordPiece vocabulary
BASE_SPECIALS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}
# The 50 added specials, ids 21128..21177 in the official tokenizer's order (control tokens last, every level).
ADDED_SPECIALS: tuple[str, ...] = (
    "[Sasr]", "[Pasr]", "[Easr]", "[Stts]", "[Ptts]", "[Etts]", "[Sbreak]", "[Pbreak]", "[Ebreak]",
    "[uv_break]", "[v_break]", "[lbreak]", "[llbreak]", "[undefine]", "[laugh]", "[spk_emb]",
    "[empty_spk]", "[music]", "[pure]",
    *(control_token(name, level) for name in ("break", "laugh", "oral", "speed")
      for level in range(CONTROL_LEVELS[name] + 1)),
)
CJK_PUNCT = "，。！？、；：“”‘’（）《》【】…—·～"
N_CJK_SINGLE = 11000  # whole-character CJK entries; the rest of the 21128 are "##" continuations


def shared_tokenizer_dir() -> Path:
    """The real tokenizer next to the repo (../shared/chattts-asset/tokenizer); may not exist."""
    return Path(__file__).resolve().parents[2] / ".." / "shared" / "chattts-asset" / "tokenizer"


def write_tokenizer(folder: Path, src: str | Path | None,
                    atomic_write: Callable[[Path, Callable[[Path], object]], None]) -> str:
    """Copy `src` (or the shared real tokenizer when present), else generate one; returns "copied"/"generated"."""
    if src is not None and not all((Path(src) / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(f"tokenizer_src: {src} must contain {', '.join(TOKENIZER_FILES)}")
    source = Path(src) if src is not None else shared_tokenizer_dir()
    if all((source / name).is_file() for name in TOKENIZER_FILES):
        for name in TOKENIZER_FILES:
            atomic_write(folder / name, functools.partial(shutil.copyfile, source / name))
        return "copied"
    texts = {"special_tokens_map.json": _json_text(special_tokens_map()),
             "tokenizer_config.json": _json_text(tokenizer_config())}
    for name, text in texts.items():
        atomic_write(folder / name, functools.partial(_write_text, text=text))
    atomic_write(folder / "tokenizer.json", lambda p: build_tokenizer().save(str(p), pretty=True))
    return "generated"


def _write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def _json_text(obj: dict[str, object]) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _token_entry(content: str) -> dict[str, object]:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False}


def special_tokens_map() -> dict[str, object]:
    named = {"cls_token": "[CLS]", "mask_token": "[MASK]", "pad_token": "[PAD]", "sep_token": "[SEP]",
             "unk_token": "[UNK]"}
    return {"additional_special_tokens": [_token_entry(t) for t in ADDED_SPECIALS]} | {
        k: _token_entry(v) for k, v in named.items()}


def tokenizer_config() -> dict[str, object]:
    ids = {**BASE_SPECIALS, **{t: BASE_VOCAB_SIZE + i for i, t in enumerate(ADDED_SPECIALS)}}
    return {
        "added_tokens_decoder": {str(i): _token_entry(t) | {"special": True} for t, i in ids.items()},
        "additional_special_tokens": list(ADDED_SPECIALS), "clean_up_tokenization_spaces": True,
        "cls_token": "[CLS]", "do_basic_tokenize": True, "do_lower_case": True, "mask_token": "[MASK]",
        "max_length": 256, "model_max_length": int(1e30), "never_split": None, "pad_to_multiple_of": None,
        "pad_token": "[PAD]", "pad_token_type_id": 0, "padding_side": "right", "sep_token": "[SEP]",
        "stride": 0, "strip_accents": None, "tokenize_chinese_chars": True, "tokenizer_class": "BertTokenizer",
        "truncation_side": "right", "truncation_strategy": "longest_first", "unk_token": "[UNK]",
    }


def base_vocab() -> list[str]:
    """21128 WordPiece entries: bert-style specials, ASCII, CJK punctuation and characters, "##" pieces."""
    head = ["[PAD]", *(f"[unused{i}]" for i in range(1, 100)), "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<S>", "<T>"]
    ascii_chars = [chr(c) for c in range(33, 127)]
    cjk = [chr(0x4E00 + i) for i in range(N_CJK_SINGLE)]
    singles = head + ascii_chars + list(CJK_PUNCT) + cjk
    pieces = ["##" + ch for ch in ascii_chars + cjk][: BASE_VOCAB_SIZE - len(singles)]
    vocab = singles + pieces
    if len(vocab) != BASE_VOCAB_SIZE or len(set(vocab)) != BASE_VOCAB_SIZE:
        raise RuntimeError(f"generated vocabulary has {len(vocab)} entries, expected {BASE_VOCAB_SIZE} distinct")
    return vocab


def build_tokenizer() -> Tokenizer:  # tokenizers is imported lazily: only needed without a real tokenizer
    """A BERT WordPiece tokenizer with the official normaliser, pre-tokeniser, decoder and added specials."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    vocab = {tok: i for i, tok in enumerate(base_vocab())}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##",
                                     max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 101), ("[SEP]", 102)])
    tok.enable_truncation(max_length=256)
    tok.enable_padding(pad_id=0, pad_token="[PAD]", length=256)
    specials = [*BASE_SPECIALS, *ADDED_SPECIALS]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    return tok
