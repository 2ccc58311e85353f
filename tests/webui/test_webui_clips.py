"""The page's clip reader: an upload it cannot read is a ValueError naming `clip`, in our words."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from chattts_velocity.audio import wav_bytes
from webui.clips import read_clip


def test_a_streamed_flac_upload_is_refused_in_our_words(streamed_flac: Path) -> None:
    with pytest.raises(ValueError, match=r"^clip: streamed\.flac: its header holds no length"):
        read_clip(streamed_flac)


def test_a_whole_flac_upload_reads(tmp_path: Path) -> None:
    pytest.importorskip("av")
    path = tmp_path / "whole.flac"
    path.write_bytes(wav_bytes(np.full(4800, 0.25, np.float32), fmt="flac"))
    assert read_clip(path).shape == (4800,)
