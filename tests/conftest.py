"""Shared fixtures: the real tokenizer/config (when present) and cached random-weight checkpoints."""
from __future__ import annotations

import os
from pathlib import Path

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
