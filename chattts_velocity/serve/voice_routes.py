"""Serving stage: the voice library over HTTP (text/voices.py keeps the files).

POST   /v1/audio/voices         JSON {name, speaker | clip_code + transcript, overwrite?}
                                or multipart {name, file (any audio soundfile reads), transcript, speaker?, overwrite?}
GET    /v1/audio/voices         presets and saved voices, each with its speaker string where it has one
GET    /v1/audio/voices/{name}  one voice (a saved one with its clip code; a blend such as alloy(2)+echo, URL-encoded,
                                with the speaker string it mixes to)
DELETE /v1/audio/voices/{name}
Errors in OpenAI's shape: 400 bad field, 404 unknown voice, 409 name taken, 413 upload or clip too large.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import IO, Any, Protocol, TypeVar

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from ..audio.wav import NO_LENGTH_HINT, SAMPLE_RATE, UNKNOWN_FRAMES
from ..engine.async_engine import AsyncLLMEngine
from ..speech.pipeline import SpeechPipeline
from ..text import decode_prompt
from ..text.blend import is_blend
from ..text.voices import UnknownVoice, Voice, VoiceExists, VoiceLibrary, check_voice_fields
from .edge import is_json_type
from .request import api_error
from .voice_fields import VoiceBook

VOICES_PATH = "/v1/audio/voices"
MAX_CLIP_SECONDS = 30.0
MIN_CLIP_SECONDS = 0.5
MAX_CLIP_CHANNELS = 8
CLIP_RATES = (8000, 96000)  # Hz
FRAMES_PER_SECOND = SAMPLE_RATE / 512  # clip-code frames a second (the DVAE's hop of 256, halved)
CLIP_PEAK_RANGE = (1e-3, 8.0)  # a sample's magnitude: below is silence, above is no recording (float files hold any)
FIELDS = ("name", "speaker", "clip_code", "transcript", "overwrite")
Fields = dict[str, Any]  # a voice body's fields, as JSON or a form gave them: VoiceLibrary.save checks each
T = TypeVar("T")


class VoiceServer(Protocol):
    """What these routes use of the app's server state (openai_api.ServerState)."""

    pipeline: SpeechPipeline
    engine: AsyncLLMEngine
    library: VoiceLibrary
    voices: VoiceBook


def add_voice_routes(app: FastAPI) -> None:
    @app.get(VOICES_PATH)
    async def list_voices(request: Request) -> dict[str, object]:
        state: VoiceServer = request.app.state.server
        presets = [_preset(state, name) for name in state.voices.presets]
        saved = [_saved(v, with_clip=False) for v in await asyncio.to_thread(state.library.list)]
        data = presets + saved
        return {"object": "list", "voices": [v["id"] for v in data], "data": data}

    @app.get(VOICES_PATH + "/{name}")
    async def get_voice(name: str, request: Request) -> dict[str, object]:
        state: VoiceServer = request.app.state.server
        if name.lower() in state.voices.presets:
            return _preset(state, name.lower())
        if is_blend(name):  # its speaker string, to save under a name (text/blend.py)
            return await asyncio.to_thread(_blend, state, name)
        return _saved(await _known(state.library.get, name), with_clip=True)

    @app.delete(VOICES_PATH + "/{name}")
    async def delete_voice(name: str, request: Request) -> dict[str, object]:
        state: VoiceServer = request.app.state.server
        if name.lower() in state.voices.presets:
            raise api_error(400, f"name: {name!r} is a preset voice; presets cannot be deleted", "name")
        await _known(state.library.delete, name)
        return {"id": name, "object": "voice.deleted", "deleted": True}

    @app.post(VOICES_PATH)
    async def create_voice(request: Request) -> JSONResponse:
        state: VoiceServer = request.app.state.server
        fields = await _fields(request, state)
        try:
            voice = await asyncio.to_thread(_save, state, fields)
        except VoiceExists as exc:
            raise api_error(409, str(exc), "name", "voice_exists") from None
        except ValueError as exc:
            raise _field_error(exc) from None
        return JSONResponse(_saved(voice, with_clip=True), status_code=201)


async def _known(action: Callable[[str], T], name: str) -> T:
    try:
        return await asyncio.to_thread(action, name)
    except UnknownVoice as exc:
        raise api_error(404, str(exc), "voice", "voice_not_found") from None


def _save(state: VoiceServer, fields: Fields) -> Voice:
    """Check what the voice holds against this model (lengths before decoding), then save it (a text thread)."""
    if fields.get("speaker") is not None:
        check_voice_fields(fields["speaker"], None, None)
        state.pipeline.speakers.check(fields["speaker"], "speaker")  # the model's width and sane values
    if fields.get("clip_code") is not None:
        check_voice_fields(None, fields["clip_code"], fields.get("transcript"))
        _check_clip_fits(state, fields["clip_code"])
    return state.library.save(fields.pop("name", None), **fields)


def _check_clip_fits(state: VoiceServer, clip_code: str) -> None:
    """A clip that fills half the engine's positions leaves too little room for the text and its audio."""
    frames = decode_prompt(clip_code).shape[1]
    limit = state.engine.engine.engine_config.max_model_len // 2
    if frames > limit:
        raise ValueError(f"clip_code: holds {frames} frames; a voice clip on this server holds at most {limit} "
                         f"(about {limit / FRAMES_PER_SECOND:.0f} s)")


def _field_error(exc: ValueError) -> Exception:
    """A 400 whose param is the voice field the message starts with ("speaker: ...")."""
    head = str(exc).split(":", 1)[0]
    return api_error(400, str(exc), head if head in FIELDS or head == "file" else None)


def _preset(state: VoiceServer, name: str) -> dict[str, object]:
    seed = state.voices.presets[name]
    return {"id": name, "object": "voice", "name": name, "kind": "preset", "seed": seed,
            "speaker": state.voices.for_seed(seed)}


def _blend(state: VoiceServer, name: str) -> dict[str, object]:
    try:
        speaker = state.voices.resolve(name)
    except ValueError as exc:
        raise api_error(400, str(exc), "voice") from None
    return {"id": name, "object": "voice", "name": name, "kind": "blend", "speaker": speaker}


def _saved(voice: Voice, with_clip: bool) -> dict[str, object]:
    entry: dict[str, object] = {
        "id": voice.name, "object": "voice", "name": voice.name, "kind": "saved", "speaker": voice.speaker,
        "has_clip": voice.clip_code is not None, "transcript": voice.transcript, "created": int(voice.created)}
    return {**entry, "clip_code": voice.clip_code} if with_clip else entry


async def _fields(request: Request, state: VoiceServer) -> Fields:
    """save() keywords from a JSON or multipart body; the clip of an upload is encoded off the event loop."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "multipart/form-data":
        return await _upload_fields(request, state)
    if not is_json_type(kind):
        raise api_error(400, f"body: {kind!r} is not accepted; send JSON {{name, speaker}} or multipart/form-data "
                             "{name, file, transcript}", code="unsupported_media_type")
    try:
        body = await asyncio.to_thread(json.loads, await request.body())
    except ValueError:
        raise api_error(400, "body: is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise api_error(400, "body: must be a JSON object {name, speaker, ...}")
    return _known_fields(body)


def _known_fields(body: Fields) -> Fields:
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise api_error(400, f"{unknown[0]}: is not a voice field; use {list(FIELDS)}", unknown[0])
    overwrite = body.get("overwrite", False)
    if overwrite not in (True, False, "true", "false"):
        raise api_error(400, f"overwrite: must be true or false, got {overwrite!r}", "overwrite")
    return {**body, "overwrite": overwrite in (True, "true")}


async def _upload_fields(request: Request, state: VoiceServer) -> Fields:
    form = await request.form(max_files=1, max_fields=len(FIELDS))
    values = {k: v for k, v in form.items() if k != "file"}
    if any(not isinstance(v, str) for v in values.values()):
        raise api_error(400, "file: send exactly one file, in the field 'file'", "file")
    fields = _known_fields(values)
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        return fields
    clip = await asyncio.to_thread(_clip, upload.file)  # the edge and the form parser spool it to disk
    try:
        fields["clip_code"] = await asyncio.to_thread(state.pipeline.speakers.from_audio, clip, SAMPLE_RATE)
    except ValueError as exc:
        raise api_error(400, f"file: cannot be cloned ({exc})", "file") from None
    return fields


def _clip(data: IO[bytes]) -> np.ndarray:
    """An uploaded audio file -> mono float32 at the model's rate; 400/413 naming `file`.

    The container's header (length, channels, rate) is checked before a sample is decoded, and decoding stops
    one block past MAX_CLIP_SECONDS whatever the header said, so a 387 KiB file of 1000 s x 8 channels costs a
    header read, not gigabytes.
    """
    import soundfile as sf

    try:
        with sf.SoundFile(data) as f:  # reads the header only
            if f.frames == UNKNOWN_FRAMES:
                raise api_error(400, f"file: {NO_LENGTH_HINT}", "file")
            _check_header(f.frames, f.channels, f.samplerate)
            blocks = []
            for block in f.blocks(blocksize=f.samplerate, dtype="float32", always_2d=True):  # [<=rate, channels]
                blocks.append(block.mean(axis=1))
                _check_seconds(sum(map(len, blocks)) / f.samplerate)
            rate = f.samplerate
    except sf.LibsndfileError as exc:  # its str() holds the file object's repr; its error_string is libsndfile's
        raise api_error(400, f"file: is not audio this server can read ({exc.error_string})", "file") from None
    mono = np.concatenate(blocks) if blocks else np.zeros(0, np.float32)
    if len(mono) / rate < MIN_CLIP_SECONDS:
        raise api_error(400, f"file: the clip is {len(mono) / rate:.2f} s; give at least {MIN_CLIP_SECONDS} s of "
                             "speech", "file")
    _check_samples(mono)
    return _resample(mono, rate, SAMPLE_RATE)


def _check_header(frames: int, channels: int, rate: int) -> None:
    _check_seconds(frames / max(rate, 1))
    if not 1 <= channels <= MAX_CLIP_CHANNELS or not CLIP_RATES[0] <= rate <= CLIP_RATES[1]:
        raise api_error(400, f"file: {channels} channels at {rate} Hz; a voice clip has 1-{MAX_CLIP_CHANNELS} channels "
                             f"at {CLIP_RATES[0]}-{CLIP_RATES[1]} Hz", "file")


def _check_seconds(seconds: float) -> None:
    if seconds > MAX_CLIP_SECONDS:
        raise api_error(413, f"file: the clip is over {MAX_CLIP_SECONDS:.0f} s ({seconds:.1f} s or more); keep it "
                             f"under {MAX_CLIP_SECONDS:.0f} s", "file", "clip_too_long")


def _check_samples(mono: np.ndarray) -> None:
    """Finite samples of a recording's loudness (not silence, not 1e30)."""
    if not np.isfinite(mono).all():
        raise api_error(400, "file: holds NaN or infinite samples; upload a recording", "file")
    peak, (low, high) = float(np.abs(mono).max()), CLIP_PEAK_RANGE
    if not low <= peak <= high:
        raise api_error(400, f"file: its loudest sample is {peak:.3g}; a recording peaks between {low:g} and {high:g} "
                             "(full scale is 1.0)", "file")


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
