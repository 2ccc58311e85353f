"""What every command shares: a loaded Chat from a `--model` value; the web UI's flags (also read by webui/app.py)."""
from __future__ import annotations

import argparse

from ..chat import Chat
from ..demo import ensure_model


def load_chat(model: str, tiny: bool, use_vllm: bool, **kwargs) -> Chat:
    root, verify = ensure_model(model, tiny)
    chat = Chat()
    chat.load(source="custom", custom_path=root, verify=verify, use_vllm=use_vllm, **kwargs)
    return chat


def add_webui_flags(p: argparse.ArgumentParser) -> None:
    """The flags of `chattts-velocity webui` and `python webui/app.py` (webui.app.serve reads them)."""
    p.add_argument("--model", default="demo", help="asset folder, or 'demo' for random demo weights")
    p.add_argument("--tiny", action="store_true", help="with --model demo: test-size weights")
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 check of a custom folder")
    p.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0 exposes the UI on the network)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--share", action="store_true", help="create a public gradio.live link")
    p.add_argument("--plain", action="store_true", help="use the plain transformers path, not the engine")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "int8"])
    p.add_argument("--max-new-token", type=int, default=2048, help="cap on audio tokens per sentence")
