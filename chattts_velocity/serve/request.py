"""Serving stage, the request: OpenAI's speech body, its checks and its errors in OpenAI's shape.

Every failure a client can cause is an HTTPException whose detail is {"message", "type", "param", "code"}
(openai_api.py renders it as {"error": detail}); nothing a body holds reaches the engine unchecked.
"""
from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypedDict, cast

from fastapi import HTTPException  # starlette's, with its detail typed as any JSON (ours is a dict)
from pydantic import BaseModel, ConfigDict, SkipValidation

from ..audio.captions import check_captions
from ..params import UPSTREAM_NAMES
from ..schema import check_sampling

logger = logging.getLogger("chattts_velocity.serve")
BODY_NAMES = {"max_new_token": "max_new_tokens", "min_new_token": "min_new_tokens"}  # SamplingParams' -> ours


class SpeechBody(BaseModel):
    """OpenAI's fields plus the usual extensions; unknown fields are ignored with a warning."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())
    model: str = "tts-1"
    input: str
    voice: SkipValidation[str | int | dict[str, object] | None] = None  # checked by text.voice_params (no bools)
    response_format: str = "mp3"
    speed: SkipValidation[float] = 1.0  # checked by serve/voice_fields.speed_prompt (true is not 1.0)
    stream: bool = False  # not given: streamed (see streamed_response); `false` given: the whole body at once
    stream_format: str = "audio"
    timestamps: bool = False  # with stream_format "sse": a speech.audio.timestamp event per sentence piece
    captions: SkipValidation[str | None] = None  # with stream_format "sse": "srt" or "vtt" text in the done event
    instructions: str | None = None  # free text; what serve/instructions.py reads in it is applied
    # typed for the API docs; checked by the one sampling validator only (sampling_kwargs), not coerced
    seed: SkipValidation[int | None] = None
    temperature: SkipValidation[float | None] = None
    top_p: SkipValidation[float | None] = None
    top_k: SkipValidation[int | None] = None
    max_new_tokens: SkipValidation[int | None] = None
    loudness: SkipValidation[float | None] = None  # target LUFS of the whole clip (audio/loudness.py), e.g. -16
    min_new_tokens: SkipValidation[int | None] = None  # forbids EOS before this many steps (benchmarks, tests)


class SamplingFields(TypedDict, total=False):
    """InferCodeParams' sampling keywords, as a speech body gives them."""

    temperature: float
    top_P: float
    top_K: int
    manual_seed: int
    max_new_token: int
    min_new_token: int


def streamed_response(body: SpeechBody) -> bool:
    """Whether the audio is sent as it is made (chunked), as OpenAI's endpoint sends it: always for SSE; else as
    `stream` says when the body gives it; else yes, unless `loudness` asks for a measure of the whole clip."""
    if body.stream_format == "sse":
        return True
    if "stream" in body.model_fields_set:
        return body.stream
    return body.loudness is None


def sampling_kwargs(body: SpeechBody, cap: int) -> SamplingFields:
    """The body's sampling fields as InferCodeParams keywords; a ValueError names the body's field."""
    names = ("temperature", "top_p", "top_k", "seed", "max_new_token", "min_new_token")
    values = {name: getattr(body, BODY_NAMES.get(name, name)) for name in names}
    values = {name: value for name, value in values.items() if value is not None}
    values.setdefault("max_new_token", cap)
    check_sampling(values, BODY_NAMES)
    if values["max_new_token"] > cap:
        raise ValueError(f"max_new_tokens: must be <= {cap} on this server, got {values['max_new_token']}")
    # each value passed check_sampling above, so each has its field's type
    return cast(SamplingFields, {UPSTREAM_NAMES.get(name, name): value for name, value in values.items()})


def check_body(body: SpeechBody, max_input_chars: int, formats: Collection[str]) -> str:
    """Validate what needs no model; returns the response format."""
    if body.model_extra:
        logger.warning("speech request: ignoring unknown field(s) %s", sorted(body.model_extra))
    if not body.input.strip():
        raise api_error(400, "input: is empty; give the text to speak", "input", "empty_input")
    if len(body.input) > max_input_chars:
        raise api_error(400, f"input: {len(body.input)} characters is over the limit of {max_input_chars}; "
                             "split the text", "input", "input_too_long")
    fmt = body.response_format.lower()
    if fmt not in formats:
        raise api_error(400, f"response_format: {body.response_format!r} is not available here; choose one "
                             f"of {list(formats)}", "response_format", "unsupported_response_format")
    if body.stream_format not in ("audio", "sse"):
        raise api_error(400, f"stream_format: must be 'audio' or 'sse', got {body.stream_format!r}", "stream_format")
    if body.timestamps and body.stream_format != "sse":
        raise api_error(400, "timestamps: sentence timestamps come as SSE events; set stream_format to 'sse'",
                        "timestamps")
    check_caption_field(body.captions, body.stream_format)
    return fmt


def check_caption_field(captions: object, stream_format: str) -> None:
    """`captions` is "srt" or "vtt" and comes with SSE (the done event carries it); a 400 naming it otherwise."""
    try:
        check_captions(captions)
    except ValueError as exc:
        raise api_error(400, str(exc), "captions") from None
    if captions is not None and stream_format != "sse":
        raise api_error(400, "captions: the caption file comes in the SSE done event; set stream_format to 'sse'",
                        "captions")


def api_error(status: int, message: str, param: str | None = None, code: str | None = None,
              kind: str = "invalid_request_error") -> HTTPException:
    return HTTPException(status, detail=error_detail(message, param, code, kind))


def error_detail(message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> dict[str, str | None]:
    return {"message": message, "type": kind, "param": param, "code": code}


# the names our ValueErrors start with -> the body field they are about
PARAM_NAMES = {"text[0]": "input", "text": "input", "speaker": "voice", "spk_emb": "voice", "spk_smp": "voice",
               "txt_smp": "voice", **BODY_NAMES}


def bad_request(exc: ValueError) -> HTTPException:
    """Our ValueErrors start with the field name ("temperature: ..."): that is OpenAI's `param` (a prompt too
    long for the model is about `input`); an error with a `code` attribute (text.EmptyText) gives it."""
    message = str(exc)
    head = message.split(":", 1)[0]
    param = "input" if head == "max_new_token" and "prompt" in message else PARAM_NAMES.get(head, head)
    error = api_error(getattr(exc, "status", 400), message, param=param if head != message and " " not in head
                      else None, code=getattr(exc, "code", None))
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:  # engine.async_engine.ClientBusy: 429
        error.headers = {"Retry-After": str(retry_after)}
    return error


def validation_detail(errors: Sequence[Mapping[str, Any]]) -> dict[str, str | None]:
    """pydantic's first complaint about a body, as OpenAI's error detail."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return error_detail(f"body: is not valid JSON ({first.get('ctx', {}).get('error', 'cannot parse')})",
                            code="invalid_json")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    return error_detail(f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid request')}",
                        param=loc[-1] if loc else None)
