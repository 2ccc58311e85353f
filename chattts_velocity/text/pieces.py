"""User texts -> sentence pieces (schema.TextPieces), and the checks every entry point applies to its texts."""
from __future__ import annotations

from chattts_velocity.schema import TextPieces
from chattts_velocity.text.normalizer import split_text


def check_texts(value: object) -> list[str]:
    """A str or a non-empty list of non-blank strs -> list[str]; anything else is a ValueError naming `text`."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, (list, tuple)) or len(texts) == 0:
        raise ValueError("text: expected a non-empty string or a non-empty list of strings")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ValueError(f"text[{i}]: expected a string, got {type(t).__name__}")
        if not t.strip():
            raise ValueError(f"text[{i}]: is empty; every text needs something to say")
    return list(texts)


def split_pieces(texts: list[str], split: bool = True) -> TextPieces:
    """Each text's sentence pieces (the whole text when split is off or it has no sentence break)."""
    pieces, owner = [], []
    for i, t in enumerate(texts):
        parts = (split_text(t) if split else []) or [t]
        pieces += parts
        owner += [i] * len(parts)
    return TextPieces(pieces, owner, len(texts))
