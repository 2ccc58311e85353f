"""Batch export, the record kept in the output folder, so that a crash at any moment loses only lines in flight.

manifest.json: the whole plan (every input line, its status, seed, hash) plus the run's model, precision and
sampling parameters; rewritten atomically after each batch. manifest.journal: one JSON line per finished WAV,
appended and fsync'd as the WAV lands; the next manifest write folds it in and empties it. A re-run trusts a WAV
only when the record holds it with the same request hash (text, speaker, seed asked for, sampling parameters) and
the file still has the digest recorded when it was written.
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


def read_record(out_dir: Path) -> dict[str, Json]:
    """output -> its latest recorded entry: manifest.json, then the journal's lines (a torn last line is ignored)."""
    entries: list[Json] = []
    try:
        entries += json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))["lines"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        for raw in (out_dir / JOURNAL).read_text(encoding="utf-8").splitlines():
            try:
                entries.append(json.loads(raw))
            except ValueError:
                continue
    except OSError:
        pass
    return {e["output"]: e for e in entries if isinstance(e, dict) and e.get("output")}


def append_journal(out_dir: Path, entry: Json) -> None:
    """One finished line, on disk before this returns."""
    with open(out_dir / JOURNAL, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def write_record(out_dir: Path, doc: Json) -> Path:
    """manifest.json, atomically; it now holds everything the journal did, so the journal goes."""
    body = json.dumps(doc, ensure_ascii=False, indent=1)
    replace_atomically(out_dir / MANIFEST, lambda tmp: tmp.write_text(body, encoding="utf-8"))
    (out_dir / JOURNAL).unlink(missing_ok=True)
    return out_dir / MANIFEST


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


def file_digest(path: Path) -> str | None:
    """sha256 of a file's bytes (32 hex digits), None if it cannot be read."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:32]
    except OSError:
        return None


def wav_seconds(path: Path) -> float | None:
    """Length of a complete, non-empty 16-bit mono WAV, or None if missing, cut short or not one."""
    try:
        with wave.open(str(path), "rb") as w:
            n = w.getnframes()
            complete = w.getnchannels() == 1 and w.getsampwidth() == 2 and len(w.readframes(n)) == 2 * n
            return n / w.getframerate() if complete and n > 0 else None
    except (OSError, EOFError, wave.Error):
        return None
