"""Batch export: text the manifest can hold. A JSON line may carry a lone surrogate ("\\ud800" is valid JSON, and
stdin decodes undecodable bytes to them); UTF-8 cannot write one, so such a line is refused by name, and what the
manifest keeps of it is escaped."""
from __future__ import annotations


def check_encodable(record: object, fields: tuple[str, ...]) -> None:
    """A ValueError naming the first of `fields` (string attributes of `record`) that UTF-8 cannot encode."""
    for name in fields:
        value = getattr(record, name)
        if not isinstance(value, str):
            continue
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"{name}: holds {value[exc.start]!r} at character {exc.start}, which is not text (a lone "
                             "surrogate half); fix the line") from None


def make_encodable(record: object, fields: tuple[str, ...]) -> None:
    """Each string of `fields` with what UTF-8 cannot encode written as a \\uXXXX escape (in place)."""
    for name in fields:
        value = getattr(record, name)
        if isinstance(value, str):
            setattr(record, name, value.encode("utf-8", "backslashreplace").decode("utf-8"))
