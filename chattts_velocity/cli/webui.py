"""`chattts-velocity webui`: its flags, and the page (webui/app.py) served on a Chat loaded from them.

Imports nothing from gradio or webui/ until the command runs, so `chattts-velocity --help` works without them.
"""
from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..demo import uses_demo_weights
from .common import add_model_flags, add_step_cap_flag, check_port_free, load_chat, max_new_token

if TYPE_CHECKING:
    from .common import Subparsers


def add_webui_flags(p: argparse.ArgumentParser) -> None:
    add_model_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0 exposes the UI on the network)")
    p.add_argument("--port", type=int, default=7860, help="port to listen on (default 7860)")
    p.add_argument("--share", action="store_true", help="also create a public gradio.live link (anyone with it "
                                                        "can use the page)")
    p.add_argument("--plain", action="store_true", help="use the plain transformers path, not the engine")
    add_step_cap_flag(p)
    p.add_argument("--voices", metavar="DIR", help="the voice library folder, shared with the server (default "
                                                   "$CHATTTS_VELOCITY_VOICES or ~/.cache/chattts_velocity/voices)")
    # defaults: the page's own (webui.app.build_ui: 5000 characters, 16 runs, 3600 s)
    p.add_argument("--max-chars", type=int, metavar="N", help="characters of text one run may hold (default 5000)")
    p.add_argument("--queue-size", type=int, metavar="N",
                   help="runs that may wait for the engine; one more is refused as 'queue full' (default 16)")
    p.add_argument("--files-ttl", type=int, metavar="S",
                   help="seconds the page keeps the audio files it made (default 3600; a tab's own downloads also "
                        "go when it closes)")


def cmd_webui(args: argparse.Namespace) -> None:
    """Load the model and serve the page until Ctrl-C."""
    try:
        from webui.app import build_ui, launch
    except ModuleNotFoundError as exc:
        raise SystemExit(f"webui: cannot import {exc.name}; it needs gradio (pip install -e '.[webui]') "
                         "and the webui/ folder of a source checkout") from None
    from ..text.voices import VoiceLibrary

    limits = {"max_chars": args.max_chars, "queue_size": args.queue_size, "files_ttl_s": args.files_ttl}
    for flag, value in zip(("--max-chars", "--queue-size", "--files-ttl"), limits.values(), strict=True):
        if value is not None and value < 1:
            raise ValueError(f"{flag}: must be at least 1, got {value}")
    check_port_free(args.host, args.port)
    chat = load_chat(args, use_vllm=not args.plain)
    page = build_ui(chat.pipeline, gpt="plain" if args.plain else "velocity", max_new_token=max_new_token(args),
                    voices=VoiceLibrary(args.voices),  # None: $CHATTTS_VELOCITY_VOICES or ~/.cache
                    demo_weights=uses_demo_weights(args.model),
                    **{name: value for name, value in limits.items() if value is not None})
    launch(page, host=args.host, port=args.port, share=args.share)


def add_webui_parser(sub: Subparsers) -> None:
    p = sub.add_parser("webui", help="Gradio web UI (pip install -e '.[webui]'; ffmpeg for streaming)")
    add_webui_flags(p)
    p.set_defaults(func=cmd_webui)
