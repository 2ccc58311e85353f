"""What every command shares: a loaded Chat from a `--model` value."""
from __future__ import annotations

from ..chat import Chat
from ..demo import ensure_model


def load_chat(model: str, tiny: bool, use_vllm: bool, **kwargs) -> Chat:
    root, verify = ensure_model(model, tiny)
    chat = Chat()
    chat.load(source="custom", custom_path=root, verify=verify, use_vllm=use_vllm, **kwargs)
    return chat
