"""User texts -> sentence pieces (schema.TextPieces), and the checks every entry point applies to its texts.

Lengths are checked on the raw characters first, before any normalisation: a call's texts may hold at most
MAX_CALL_CHARS characters and MAX_CALL_PIECES sentence pieces, and one sentence piece at most MAX_PIECE_CHARS (no
piece that long fits the GPT's 4096 positions with room for its audio); the positions themselves are checked when the
prompts are built.
"""
from __future__ import annotations

import re
from collections.abc import Callable

from chattts_velocity.config import ModelConfig
from chattts_velocity.schema import TextPieces
from chattts_velocity.text.normalizer import split_text

MAX_CALL_CHARS = 100_000  # characters of text one call may hold (a long chapter; more is split by the caller)
MAX_PIECE_CHARS = 4 * ModelConfig.max_position_embeddings  # characters of one sentence piece (4 per GPT position)
MAX_CALL_PIECES = 2048  # sentence pieces one call may hold: each holds its prompt, codes and audio until the call ends
_SPOKEN = re.compile(r"[A-Za-z0-9\u4e00-\u9fff]")  # what the model can say; tags like [uv_break] are not speech
_TAG = re.compile(r"\[[\w_]+\]")


class EmptyText(ValueError):
    """A text with nothing left to say once normalised (zero-width characters, marks only, ...)."""

    code = "empty_input"


def check_texts(value: object, max_chars: int = MAX_CALL_CHARS) -> list[str]:
    """A str or a non-empty list of non-blank strs of at most `max_chars` characters in all -> list[str]; anything
    else is a ValueError naming `text`."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, (list, tuple)) or len(texts) == 0:
        raise ValueError("text: expected a non-empty string or a non-empty list of strings")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ValueError(f"text[{i}]: expected a string, got {type(t).__name__}")
        if not t.strip():
            raise EmptyText(f"text[{i}]: is empty; every text needs something to say")
    if len(texts) > MAX_CALL_PIECES:
        raise _too_many_pieces(len(texts), "texts")
    total = sum(len(t) for t in texts)
    if total > max_chars:
        raise ValueError(f"text: {total} characters is over the limit of {max_chars} for one call; split the text "
                         "into several calls")
    return list(texts)


def split_pieces(texts: list[str], split: bool = True) -> TextPieces:
    """Each text's sentence pieces (the whole text when split is off or it has no sentence break)."""
    pieces, owner = [], []
    for i, t in enumerate(texts):
        parts = (split_text(t) if split else []) or [t]
        longest = max(len(p) for p in parts)
        if longest > MAX_PIECE_CHARS:
            raise ValueError(f"text[{i}]: a sentence of {longest} characters is over the limit of {MAX_PIECE_CHARS}; "
                             "break it into sentences")
        pieces += parts
        owner += [i] * len(parts)
        if len(pieces) > MAX_CALL_PIECES:
            raise _too_many_pieces(len(pieces), "sentence pieces or more")
    return TextPieces(pieces, owner, len(texts))


def _too_many_pieces(count: int, what: str) -> ValueError:
    return ValueError(f"text: {count} {what} is over the limit of {MAX_CALL_PIECES} sentence pieces for one call "
                      "(MAX_CALL_PIECES, a bound on the memory a call holds); split the texts into several calls")


def normalized_pieces(texts: object, normalize: Callable[[str], str], split: bool = True,
                      allow_empty: bool = False) -> TextPieces:
    """Checked texts (lengths first) -> the normalised sentence pieces that hold speech (Chat.split)."""
    pieces = split_pieces(check_texts(texts), split)
    return spoken_pieces(pieces.replace([normalize(p) for p in pieces.texts]), allow_empty)


def is_speech(piece: str) -> bool:
    """Whether a normalised piece holds anything to say (a letter, digit or Chinese character outside [tags])."""
    return _SPOKEN.search(_TAG.sub("", piece)) is not None


def spoken_pieces(pieces: TextPieces, allow_empty: bool = False) -> TextPieces:
    """The normalised pieces that hold speech; a text left with none is an EmptyText naming it (unless
    `allow_empty`: then it simply has no pieces)."""
    keep = [k for k, piece in enumerate(pieces.texts) if is_speech(piece)]
    kept = TextPieces([pieces.texts[k] for k in keep], [pieces.owner[k] for k in keep], pieces.num_texts)
    if not allow_empty:
        for i in sorted(set(pieces.owner) - set(kept.owner)):
            raise empty_text(i)
    return kept


def empty_text(i: int) -> EmptyText:
    return EmptyText(f"text[{i}]: holds nothing to say once normalised (only spaces, marks, invisible or unreadable "
                     "characters); give words")
