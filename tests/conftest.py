"""Shared fixtures: the real tokenizer/config (when present) and cached random-weight checkpoints."""
from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_ASSETS = REPO.parent / "shared" / "chattts-asset"
CACHE = Path(os.environ.get("CHATTTS_VELOCITY_TEST_CACHE", REPO / ".pytest-assets"))

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
# Triton's CPU interpreter (tests/model/test_triton_kernels.py) must be chosen before anything imports triton;
# tests/model/conftest.py imports transformers, which does.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def triton_device() -> str:
    """Where tests run the triton backend: the GPU when there is one and no interpreter, else the CPU under Triton's
    interpreter."""
    return "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"


@pytest.fixture(scope="session")
def shared_assets() -> Path:
    if not (SHARED_ASSETS / "tokenizer" / "tokenizer.json").exists():
        pytest.skip(f"needs the real ChatTTS tokenizer and gpt/config.json at {SHARED_ASSETS} (its licence keeps it "
                    "out of this repository): `hf download 2Noise/ChatTTS --include 'asset/tokenizer/*' "
                    "'asset/gpt/config.json' --local-dir DIR` and copy DIR/asset/* there")
    return SHARED_ASSETS


def _demo_assets(name: str, tiny: bool) -> Path:
    from chattts_velocity.demo import is_demo_folder, write_demo_assets

    root = CACHE / name
    if not is_demo_folder(root):
        write_demo_assets(root, seed=0, tiny=tiny, progress=False)
    return root


@pytest.fixture(scope="session")
def tiny_assets() -> Path:
    """A tiny random checkpoint in the official format (written once, cached across runs)."""
    return _demo_assets("tiny", tiny=True)


@pytest.fixture(scope="session")
def full_assets() -> Path:
    """Full-size random weights (about 1 GB on disk); only for tests marked slow or parity."""
    return _demo_assets("full", tiny=False)


def _decode_audio(data: bytes) -> tuple[np.ndarray, int]:  # -> ([N] int16 mono, rate); Opus decodes at 48 kHz
    """Any encoded clip of audio/formats.py but raw pcm, decoded by PyAV (ffmpeg reads ADTS AAC and 24 kHz Opus,
    which soundfile cannot); of a stereo ogg (the clip in both channels) the first channel."""
    av = pytest.importorskip("av")
    with av.open(io.BytesIO(data)) as container:
        frames = [_first_channel(f) for f in container.decode(audio=0)]
        rate = container.streams.audio[0].codec_context.sample_rate
    audio = np.concatenate(frames) if frames else np.zeros(0, np.float32)
    return (audio if audio.dtype == np.int16 else np.rint(np.clip(audio, -1, 1) * 32767)).astype(np.int16), rate


def _first_channel(frame) -> np.ndarray:  # -> [N]: a planar frame is [channels, N], a packed one [1, N * channels]
    samples = frame.to_ndarray()
    return samples[0] if frame.format.is_planar else samples.reshape(-1)[::len(frame.layout.channels)]


@pytest.fixture(scope="session")
def decode_audio():
    """_decode_audio as a fixture (test modules share no import path)."""
    return _decode_audio


@pytest.fixture
def streamed_flac(tmp_path: Path) -> Path:
    """A FLAC file written as the server streams one (0.2 s of silence): its STREAMINFO holds no length."""
    pytest.importorskip("av")
    from chattts_velocity.audio import open_encoder

    encoder = open_encoder("flac")
    path = tmp_path / "streamed.flac"
    path.write_bytes(encoder.encode(np.zeros(4800, np.float32)) + encoder.flush())
    return path
