"""Shared fixture of the in-process server tests: the app on the tiny random weights behind a TestClient."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def client(tiny_assets, tmp_path_factory):
    """A started app (one per test module): velocity engine, no warm-up, 64 steps at most per piece."""
    from fastapi.testclient import TestClient

    from chattts_velocity import Chat
    from chattts_velocity.serve import ServerConfig, create_app

    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True)
    config = ServerConfig(voices_dir=str(tmp_path_factory.mktemp("voices")), warmup_steps=0, max_new_token=64)
    with TestClient(create_app(chat, config)) as client:
        yield client
