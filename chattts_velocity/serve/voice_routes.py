"""Serving stage: the voice library over HTTP (text/voices.py keeps the files).

POST   /v1/audio/voices         JSON {name, speaker | clip_code + transcript, overwrite?}
                                or multipart {name, file (any audio soundfile reads), transcript, speaker?, overwrite?}
GET    /v1/audio/voices         presets and saved voices, each with its speaker string where it has one
GET    /v1/audio/voices/{name}  one voice (a saved one with its clip code)
DELETE /v1/audio/voices/{name}
Errors in OpenAI's shape: 400 bad field, 404 unknown voice, 409 name taken, 413 upload or clip too large.
"""
from __future__ import annotations

import asyncio
import io
import json

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..audio.wav import SAMPLE_RATE
from ..text.voices import UnknownVoice, Voice, VoiceExists
from .request import api_error

VOICES_PATH = "/v1/audio/voices"
MAX_CLIP_SECONDS = 30.0
MIN_CLIP_SECONDS = 0.5
FIELDS = ("name", "speaker", "clip_code", "transcript", "overwrite")


def add_voice_routes(app: FastAPI) -> None:
    @app.get(VOICES_PATH)
    async def list_voices(request: Request) -> dict:
        state = request.app.state.server
        presets = [_preset(state, name) for name in state.voices.presets]
        saved = [_saved(v, with_clip=False) for v in await asyncio.to_thread(state.library.list)]
        data = presets + saved
        return {"object": "list", "voices": [v["id"] for v in data], "data": data}

    @app.get(VOICES_PATH + "/{name}")
    async def get_voice(name: str, request: Request) -> dict:
        state = request.app.state.server
        if name.lower() in state.voices.presets:
            return _preset(state, name.lower())
        return _saved(await _known(state.library.get, name), with_clip=True)

    @app.delete(VOICES_PATH + "/{name}")
    async def delete_voice(name: str, request: Request) -> dict:
        state = request.app.state.server
        if name.lower() in state.voices.presets:
            raise api_error(400, f"name: {name!r} is a preset voice; presets cannot be deleted", "name")
        await _known(state.library.delete, name)
        return {"id": name, "object": "voice.deleted", "deleted": True}

    @app.post(VOICES_PATH)
    async def create_voice(request: Request) -> JSONResponse:
        state = request.app.state.server
        fields = await _fields(request, state)
        if fields.get("speaker") is not None:
            _checked(state.voices.check_speaker, fields["speaker"], "speaker")
        try:
            voice = await asyncio.to_thread(state.library.save, fields.pop("name", None), **fields)
        except VoiceExists as exc:
            raise api_error(409, str(exc), "name", "voice_exists") from None
        except ValueError as exc:
            raise _field_error(exc) from None
        return JSONResponse(_saved(voice, with_clip=True), status_code=201)


async def _known(action, name: str):
    try:
        return await asyncio.to_thread(action, name)
    except UnknownVoice as exc:
        raise api_error(404, str(exc), "voice", "voice_not_found") from None


def _checked(check, value: object, field: str) -> None:
    try:
        check(value, field)
    except ValueError as exc:
        raise _field_error(exc) from None


def _field_error(exc: ValueError) -> Exception:
    """A 400 whose param is the voice field the message starts with ("speaker: ...")."""
    head = str(exc).split(":", 1)[0]
    return api_error(400, str(exc), head if head in FIELDS or head == "file" else None)


def _preset(state, name: str) -> dict:
    seed = state.voices.presets[name]
    return {"id": name, "object": "voice", "name": name, "kind": "preset", "seed": seed,
            "speaker": state.voices.for_seed(seed)}


def _saved(voice: Voice, with_clip: bool) -> dict:
    entry = {"id": voice.name, "object": "voice", "name": voice.name, "kind": "saved", "speaker": voice.speaker,
             "has_clip": voice.clip_code is not None, "transcript": voice.transcript, "created": int(voice.created)}
    return {**entry, "clip_code": voice.clip_code} if with_clip else entry


async def _fields(request: Request, state) -> dict:
    """save() keywords from a JSON or multipart body; the clip of an upload is encoded off the event loop."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        return await _upload_fields(request, state)
    if kind not in ("application/json", ""):
        raise api_error(400, f"body: {kind!r} is not accepted; send JSON {{name, speaker}} or multipart/form-data "
                             "{name, file, transcript}", code="unsupported_media_type")
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise api_error(400, "body: is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise api_error(400, "body: must be a JSON object {name, speaker, ...}")
    return _known_fields(body)


def _known_fields(body: dict) -> dict:
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise api_error(400, f"{unknown[0]}: is not a voice field; use {list(FIELDS)}", unknown[0])
    overwrite = body.get("overwrite", False)
    if overwrite not in (True, False, "true", "false"):
        raise api_error(400, f"overwrite: must be true or false, got {overwrite!r}", "overwrite")
    return {**body, "overwrite": overwrite in (True, "true")}


async def _upload_fields(request: Request, state) -> dict:
    form = await request.form(max_files=1, max_fields=len(FIELDS))
    values = {k: v for k, v in form.items() if k != "file"}
    if any(not isinstance(v, str) for v in values.values()):
        raise api_error(400, "file: send exactly one file, in the field 'file'", "file")
    fields = _known_fields(values)
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        return fields
    clip = _clip(await upload.read())
    try:
        fields["clip_code"] = await asyncio.to_thread(state.chat.sample_audio_speaker, clip, SAMPLE_RATE)
    except ValueError as exc:
        raise api_error(400, f"file: cannot be cloned ({exc})", "file") from None
    return fields


def _clip(data: bytes) -> np.ndarray:
    """An uploaded audio file -> mono float32 at the model's rate; 400/413 naming `file`."""
    import soundfile as sf

    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)  # [N, channels]
    except Exception as exc:  # noqa: BLE001 -- libsndfile's errors vary by format and version
        raise api_error(400, f"file: is not audio this server can read ({exc})", "file") from None
    seconds = len(samples) / rate
    if seconds > MAX_CLIP_SECONDS:
        raise api_error(413, f"file: the clip is {seconds:.1f} s; keep it under {MAX_CLIP_SECONDS:.0f} s",
                        "file", "clip_too_long")
    if seconds < MIN_CLIP_SECONDS:
        raise api_error(400, f"file: the clip is {seconds:.2f} s; give at least {MIN_CLIP_SECONDS} s of speech",
                        "file")
    return _resample(samples.mean(axis=1), rate, SAMPLE_RATE)


def _resample(x: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Band-limited resampling through the spectrum (the clip is short; no resampler dependency)."""
    if rate == target:
        return x.astype(np.float32)
    n = max(1, round(len(x) * target / rate))
    spectrum = np.fft.rfft(x)
    kept = np.zeros(n // 2 + 1, dtype=spectrum.dtype)
    k = min(len(kept), len(spectrum))
    kept[:k] = spectrum[:k]
    return (np.fft.irfft(kept, n) * (n / len(x))).astype(np.float32)
