"""Serving stage: the model names a speech request may give (the official openai client's `SpeechModel` names).

Every name is the same model: the server's own (ServerConfig.model_name, "chattts"), OpenAI's tts-1, tts-1-hd and
gpt-4o-mini-tts, and any dated gpt-4o-mini-tts snapshot (gpt-4o-mini-tts-YYYY-MM-DD). The voices the client names
are presets of text/voices.PRESET_SEEDS.
"""
from __future__ import annotations

import re

from .request import api_error

# what GET /v1/models lists beside the server's own name
MODEL_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15")
DATED_MODEL = re.compile(r"gpt-4o-mini-tts-\d{4}-\d{2}-\d{2}")


def model_names(server_model: str) -> tuple[str, ...]:
    """The names GET /v1/models lists (dated snapshots other than the client's are accepted, not listed)."""
    return (server_model, *MODEL_ALIASES)


def check_model(model: object, server_model: str) -> None:
    """Unknown model names get OpenAI's 404 model_not_found."""
    known = model_names(server_model)
    if model in known or (isinstance(model, str) and DATED_MODEL.fullmatch(model)):
        return
    raise api_error(404, f"model: {str(model)[:80]!r} does not exist here; use one of {list(known)} or a dated "
                         "gpt-4o-mini-tts-YYYY-MM-DD (GET /v1/models)", "model", "model_not_found")
