"""The export tests' model: the tiny random weights on the velocity engine, loaded once per test module."""
from __future__ import annotations

from pathlib import Path

import pytest

from chattts_velocity import Chat


@pytest.fixture(scope="module")
def chat(tiny_assets: Path) -> Chat:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True)
    return chat
