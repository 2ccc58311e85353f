"""Serving stage: the server's settings (limits, budgets, timeouts), checked when made."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..schema import MAX_NEW_TOKEN
from ..speech.streams import StreamOptions
from .clients import Clients, KeyLimits, read_keys_file

API_KEY_ENV = "CHATTTS_VELOCITY_API_KEY"  # the key need not appear on the command line (or in `ps`)


@dataclass
class ServerConfig:
    model_name: str = "chattts"
    api_key: str | None = field(default_factory=lambda: os.environ.get(API_KEY_ENV) or None)  # Bearer key on /v1/*
    api_keys_file: str | None = None  # more keys, one a line with optional limits (serve/clients.read_keys_file)
    trusted_proxies: tuple[str, ...] = ()  # peers whose X-Forwarded-For names the client (else the peer is)
    allowed_origins: tuple[str, ...] = ()  # browser origins besides the server's own that may POST/DELETE
    max_input_chars: int = 4096
    max_body_bytes: int = 1 << 20  # larger bodies get 413 before they are read
    max_pieces: int = 128  # sentence pieces one input may split into
    max_new_token: int = MAX_NEW_TOKEN  # per sentence piece; a request's max_new_tokens may only lower it
    split_text: bool = True  # sentence pieces generate concurrently and play in order
    warmup_steps: int = 16  # one short request at startup, so the first user does not pay first-call costs
    stream_options: StreamOptions = field(default_factory=StreamOptions)
    cache_mb: int = 64  # finished audio of seeded requests kept for identical repeats (serve/cache.py); 0: off
    voices_dir: str | None = None  # the voice library's folder; None: $CHATTTS_VELOCITY_VOICES or ~/.cache/...
    max_voices: int = 1000
    max_upload_bytes: int = 16 << 20  # a voice clip upload (POST /v1/audio/voices) may be this large
    text_workers: int = 2  # threads doing requests' text work (SSML, normalising, tokenising) off the event loop
    text_processes: int = 1  # processes normalising texts over 256 characters (no GIL shared with the engine); 0: none
    text_budget_s: float = 10.0  # CPU seconds one text job may take, else a 400 (4096 chars take ~1 s)
    header_timeout_s: float = 10.0  # a connection must send a request's headers within this (serve/timeouts.py)
    body_timeout_s: float = 30.0  # and then its whole body within this
    send_timeout_s: float = 30.0  # a stream whose client reads nothing this long is cancelled, its connection closed
    shutdown_grace_s: float = 10.0  # on SIGTERM, responses in flight get this long before they are cut
    stream_window_pieces: int = 8  # a streamed request's pieces in the engine at once, from the one its client reads
    max_queued_per_client: int = 512  # unfinished sentence pieces one client (its address) may have: 429
    max_preparing_per_client: int = 64  # requests one client may have in text work (and refine) at once: 429
    body_budget_bytes: int = 128 << 20  # request bodies held at once, all connections; past it a new body gets 503
    strict_instructions: bool = False  # `instructions` outside the grammar: 400 (else read as free text, reported)
    ws_max_session_chars: int = 100_000  # text one speech WebSocket session may send in all (serve/ws_speech.py)
    ws_sessions_per_client: int = 64  # speech WebSocket sessions one client (API key, else address) may hold at once
    ws_idle_timeout_s: float = 60.0  # a session with nothing to speak that sends nothing this long is closed

    def __post_init__(self) -> None:
        for name in ("max_input_chars", "max_body_bytes", "max_pieces", "max_new_token", "max_voices",
                     "max_upload_bytes", "text_workers", "body_budget_bytes",
                     "max_queued_per_client", "max_preparing_per_client", "stream_window_pieces",
                     "ws_max_session_chars", "ws_sessions_per_client"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        for name in ("cache_mb", "text_processes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: must be an integer >= 0 (0 turns it off), got {value!r}")
        for name in ("text_budget_s", "header_timeout_s", "body_timeout_s", "send_timeout_s", "shutdown_grace_s",
                     "ws_idle_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"{name}: must be a number of seconds > 0, got {value!r}")
        self.trusted_proxies, self.allowed_origins = tuple(self.trusted_proxies), tuple(self.allowed_origins)
        Clients(self.api_keys(), None, self.trusted_proxies)  # a bad keys file or address fails here, at startup

    def api_keys(self) -> dict[str, KeyLimits]:
        """Every key the server accepts, with its limits ({}: keyless)."""
        keys = read_keys_file(self.api_keys_file) if self.api_keys_file is not None else {}
        if self.api_key is not None:
            keys.setdefault(self.api_key, KeyLimits())
        return keys
