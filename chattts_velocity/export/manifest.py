"""Batch export, what the record is made of: request hashes, file digests, WAV lengths, atomic writes.

A re-run trusts a WAV only when the record (record.py) holds it with the same request hash (text, speaker, seed
asked for, sampling parameters) and the file still has the digest recorded when it was written. Files are read
through safe_files: a link, FIFO or device named like an output is never opened.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import wave
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .safe_files import UnsafeFile, open_regular

if TYPE_CHECKING:
    from ..params import InferCodeParams

Json = dict[str, Any]  # a JSON object, as written or read back
MANIFEST = "manifest.json"
JOURNAL = "manifest.journal"
# InferCodeParams fields that are per line (speaker, seed) or do not change the audio
NOT_HASHED = {"spk_emb", "manual_seed", "show_tqdm", "logits_processors", "stream_batch", "stream_speed",
              "pass_first_n_batches"}


def params_record(params: InferCodeParams) -> Json:
    """The sampling parameters that shape every line's audio, as JSON-able values."""
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params) if f.name not in NOT_HASHED}


def request_hash(text: str, speaker: str | None, seed: int | None, params: Json,
                 clip: Mapping[str, object] | None = None) -> str:
    """What a line asked for; seed is None when the line did not choose one (then any recorded seed will do).
    `clip` is a cloned voice's {spk_smp, txt_smp} (left out when empty, so older records keep their hashes)."""
    doc = {"text": text, "speaker": speaker, "seed": seed, "params": params, **({"clip": clip} if clip else {})}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode("utf-8")).hexdigest()[:32]


FILE_MODE = 0o644  # the WAVs and the manifest: readable by others, as `demo`'s WAVs and any file written by open()


def replace_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """write() a hidden temp file (a unique name per call), fsync, rename: a crash never leaves a partial file under
    `path`, and two writers never share a temp file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        with open(tmp, "r+b") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)  # mkstemp made it 0600
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def text_digest(text: str) -> str:
    """What the record keeps of a line's text (with its length): sha256, 32 hex digits."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def file_digest(path: Path) -> str | None:
    """sha256 of a regular file's bytes (32 hex digits), None if it cannot be read or is not a regular file."""
    digest = hashlib.sha256()
    try:
        with os.fdopen(open_regular(path, os.O_RDONLY), "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
    except (OSError, UnsafeFile):
        return None
    return digest.hexdigest()[:32]


def wav_seconds(path: Path) -> float | None:
    """Length of a complete, non-empty 16-bit mono WAV, or None if missing, cut short, not one or not a regular
    file (a link, FIFO or device is never opened)."""
    try:
        with os.fdopen(open_regular(path, os.O_RDONLY), "rb") as f, wave.open(f, "rb") as w:
            n = w.getnframes()
            complete = w.getnchannels() == 1 and w.getsampwidth() == 2 and len(w.readframes(n)) == 2 * n
            return n / w.getframerate() if complete and n > 0 else None
    except (OSError, EOFError, wave.Error, UnsafeFile):
        return None
