"""The export's files (WAVs, manifest, timestamps) are mode 0644 like every other file the commands write, not the
0600 of their temp files."""
from __future__ import annotations

import stat
from pathlib import Path

from chattts_velocity.export import replace_atomically


def test_files_replaced_atomically_are_readable_by_others(tmp_path: Path) -> None:
    path = tmp_path / "out" / "00001.wav"
    replace_atomically(path, lambda tmp: tmp.write_bytes(b"RIFF"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and path.read_bytes() == b"RIFF"
