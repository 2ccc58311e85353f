"""Shared fixtures: the real tokenizer/config (when present) and cached random-weight checkpoints."""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from mark_filter import deselects_every_test, module_marks

REPO = Path(__file__).resolve().parents[1]
SHARED_ASSETS = REPO.parent / "shared" / "chattts-asset"
CACHE = Path(os.environ.get("CHATTTS_VELOCITY_TEST_CACHE", REPO / ".pytest-assets"))

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
# Triton's CPU interpreter (tests/model/test_triton_kernels.py) must be chosen before anything imports triton;
# tests/model/conftest.py imports transformers, which does.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


_KERNEL_BUILDS: list[threading.Thread] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    """On a run of the whole suite, the C++ CPU kernels of this CPU (when not cached yet: 25-60 s of g++ on 2 cores)
    build in a thread while collection imports the test modules on one core; collection's end waits for the build,
    so no test starts a second one."""
    config = session.config
    if config.option.collectonly or config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return
    from chattts_velocity.model import kernels

    which = kernels.isa()
    if which is not None:
        _KERNEL_BUILDS.append(threading.Thread(target=_build_kernels, args=(which,), name="kernel-build", daemon=True))
        _KERNEL_BUILDS[-1].start()


def _build_kernels(which: str) -> None:
    from chattts_velocity.model import kernels
    from chattts_velocity.model.kernels.build import build_library

    with contextlib.suppress(OSError, RuntimeError, subprocess.SubprocessError):  # kernels.load() retries, says why
        build_library(which, kernels.ISAS[which])


def pytest_collection_finish(session: pytest.Session) -> None:
    while _KERNEL_BUILDS:
        _KERNEL_BUILDS.pop().join()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave unimported a test module whose module-level `pytestmark` makes the -m expression deselect all of its
    tests (the e2e, parity and triton modules under the default addopts): importing them costs seconds of servers',
    browsers' and clients' packages for no test. A file named on the command line is always collected."""
    if not (collection_path.name.startswith("test_") and collection_path.suffix == ".py"):
        return None
    marks = module_marks(collection_path)
    return True if marks and deselects_every_test(config.option.markexpr, marks) else None


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
