"""Batch export, output names: where each line's WAV goes inside the output folder (never outside it)."""
from __future__ import annotations

import re
from pathlib import Path

from ..audio.formats import WAV

SIDECAR_SUFFIX = ".timestamps.json"  # NAME.timestamps.json beside NAME.wav
MAX_NAME_BYTES = 255  # a file name (one path component) on Linux, macOS and Windows filesystems
TEMP_EXTRA_BYTES = len(".") + len(".") + 8 + len(".tmp")  # manifest.replace_atomically's ".NAME.XXXXXXXX.tmp"


def output_name(output: object, ident: str | None, number: int, root: Path) -> str:
    """An explicit output (inside the folder) wins, then the sanitised id, then the line number."""
    if output is not None:
        return _fits("output", _checked_output(output, root))
    if ident is None:
        return f"{number:05d}{WAV.extension}"
    # Word characters (any script), dot and dash; no leading dot, so no hidden file and no "..".
    name = re.sub(r"[^\w.\-]+", "_", ident).lstrip("._")[:120]
    if not name:
        raise ValueError(f'id: {ident!r} has no characters usable in a file name; add an "output"')
    return _fits("id", name + WAV.extension)


def _fits(field: str, relative: str) -> str:
    """A name whose every file (the WAV, its sidecar, their temporary names) fits MAX_NAME_BYTES, checked before any
    synthesis (a name past it would be synthesised and then fail to write)."""
    *folders, name = relative.split("/")
    longest = len(name.removesuffix(WAV.extension).encode("utf-8")) + len(SIDECAR_SUFFIX) + TEMP_EXTRA_BYTES
    if longest > MAX_NAME_BYTES or any(len(f.encode("utf-8")) > MAX_NAME_BYTES for f in folders):
        raise ValueError(f"{field}: makes the file name {name[:40]!r}... of {len(name.encode('utf-8'))} bytes; with "
                         f"its temporary and timestamps names that passes the {MAX_NAME_BYTES} bytes a file name may "
                         "hold; give a shorter one")
    return relative


def _checked_output(value: object, root: Path) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"output: must be a non-empty path relative to the output folder, got {value!r}")
    if Path(value).is_absolute():
        raise ValueError(f"output: {value!r} is absolute; give a path relative to the output folder")
    if Path(value).suffix.lower() != WAV.extension:
        raise ValueError(f"output: {value!r} must end in {WAV.extension} (the export writes {WAV.name.upper()} files)")
    base = root.resolve()
    target = (base / value).resolve()
    if not target.is_relative_to(base) or target == base:
        raise ValueError(f"output: {value!r} escapes the output folder {root}; keep it inside")
    return target.relative_to(base).as_posix()
