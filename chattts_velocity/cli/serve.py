"""`chattts-velocity serve`: its flags and how they become a ServerConfig (local uvicorn or Ray Serve).

Imports nothing from the [server] extra until the command runs, so `chattts-velocity --help` works without it.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .common import (
    add_model_flags,
    add_step_cap_flag,
    check_port_free,
    engine_options,
    load_chat,
    max_new_token,
    model_folder,
    resolve_dtype,
)
from .env_config import DOTENV, add_env_defaults, read_dotenv, resolve_env, settings_environment

if TYPE_CHECKING:
    from ..serve.server_config import ServerConfig
    from .common import Subparsers


LIMIT_FLAGS = {  # ServerConfig field -> (type, help); each is the flag --FIELD-WITH-DASHES, unset keeps the default
    "text_budget_s": (float, "CPU seconds one text job (SSML, normalising) may take before a 400 (default 10)"),
    "text_processes": (int, "processes normalising long texts beside the engine (default 1; 0: threads only)"),
    "header_timeout_s": (float, "seconds a client has to send a request's headers (default 10)"),
    "body_timeout_s": (float, "seconds a client then has to send the whole body, else 408 (default 30)"),
    "send_timeout_s": (float, "seconds a stream may go unread before it is cancelled and its KV freed (default 30)"),
    "stream_window_pieces": (int, "sentence pieces of a stream generated ahead of the one its client reads "
                                  "(default 8)"),
    "max_body_bytes": (int, "largest request body of the speech route, else 413 (default 1048576)"),
    "max_upload_bytes": (int, "largest voice clip upload, else 413 (default 16777216)"),
    "body_budget_bytes": (int, "request bodies held at once over all connections; past it 503 (default 134217728)"),
    "max_pieces": (int, "sentence pieces one input may split into, else 400 (default 128)"),
    "max_queued_per_client": (int, "unfinished sentence pieces one client may have, else 429 (default 512)"),
    "max_preparing_per_client": (int, "requests one client may have in text work and refine at once, else 429 "
                                      "(default 64)"),
    "shutdown_grace_s": (float, "seconds responses in flight get on SIGTERM before they are cut (default 10)"),
    "max_voices": (int, "voices the library may hold (default 1000)"),
}


def server_config(args: argparse.Namespace) -> ServerConfig:
    """ServerConfig from the serve flags (unset ones keep its defaults); a bad value is a ValueError naming its flag."""
    from ..serve.server_config import ServerConfig
    from ..speech.streams import StreamOptions

    resolve_env(args)
    stream = {k: getattr(args, k) for k in ("chunk_steps", "first_chunk_steps", "first_lookahead_steps")}
    try:  # None keeps the defaults (for streaming: the exact receptive-field context)
        key = {"api_key": args.api_key} if args.api_key else {}  # else $CHATTTS_VELOCITY_API_KEY
        clients = {"api_keys_file": args.api_keys_file, "trusted_proxies": _listed(args.trusted_proxy),
                   "allowed_origins": _listed(args.allowed_origins)}
        voices = {"voices_dir": args.voices} if args.voices else {}  # else $CHATTTS_VELOCITY_VOICES or ~/.cache
        cache = {} if args.cache_mb is None else {"cache_mb": args.cache_mb}
        limits = {name: getattr(args, name) for name in LIMIT_FLAGS if getattr(args, name) is not None}
        return ServerConfig(**key, **clients, **voices, **cache, **limits, max_new_token=max_new_token(args),
                            strict_instructions=args.strict_instructions,
                            stream_options=StreamOptions(**{k: v for k, v in stream.items() if v is not None}),
                            max_input_chars=ServerConfig.max_input_chars if args.max_input_chars is None
                            else args.max_input_chars)
    except ValueError as exc:
        field, _, why = str(exc).partition(":")
        flag = {"trusted_proxies": "trusted-proxy"}.get(field, field.replace("_", "-"))  # the flag as typed
        raise ValueError(f"--{flag}:{why}") from None


def _listed(value: str | None) -> tuple[str, ...]:
    """A comma-separated flag's items."""
    return tuple(item.strip() for item in (value or "").split(",") if item.strip())


def cmd_serve(args: argparse.Namespace) -> None:
    for key, value in read_dotenv(Path.cwd() / DOTENV).items():  # settings without a flag (CHATTTS_VELOCITY_CACHE)
        os.environ.setdefault(key, value)
    try:
        from ..serve.openai_api import run_server
    except ImportError as exc:
        raise ValueError(f"serve: needs the [server] extra (cannot import {exc.name}); "
                         "pip install 'chattts_velocity[server]'") from None
    config = server_config(args)
    if args.ray:
        _serve_with_ray(args, config)
        return
    check_port_free(args.host, args.port)
    chat = load_chat(args, compile=args.compile)  # a bad model fails here, in one line, before the server starts
    run_server(chat.pipeline, config, host=args.host, port=args.port)


def _serve_with_ray(args: argparse.Namespace, config: ServerConfig) -> None:
    """Serve on Ray until SIGTERM, SIGINT or SIGHUP; then stop Serve, Ray and every process the driver started."""
    from ..cluster import init_ray  # imports no ray: init_ray sets the loopback env first
    from ..serve import ray_serve, ray_stop

    try:
        init_ray(args.ray_address, log_to_driver=True)
        ray_stop.stop_on_signals()  # after ray.init, which installs its own SIGTERM handler
        root, verify = model_folder(args)
        options = ray_serve.ReplicaOptions(replicas=args.replicas, autoscale=args.autoscale,
                                           num_cpus=args.replica_cpus, num_gpus=args.replica_gpus,
                                           max_ongoing_requests=args.max_ongoing_requests)
        app = ray_serve.build_app(root, config, options, verify=verify, dtype=resolve_dtype(args),
                                  compile=args.compile, **engine_options(args))
        ray_serve.serve_on_ray(app, host=args.host, port=args.port)
    except ray_stop.StopRequested as stop:
        print(f"serve: {stop}: shutting the Ray cluster down", file=sys.stderr)
    finally:
        ray_stop.shutdown_cluster()


def _min_max(value: str) -> tuple[int, int]:
    low, sep, high = value.partition(":")
    if not (sep and low.isdigit() and high.isdigit()) or not 1 <= int(low) <= int(high):
        raise argparse.ArgumentTypeError(f"expected MIN:MAX with 1 <= MIN <= MAX, got {value!r}")
    return int(low), int(high)


def add_serve_parser(sub: Subparsers) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible speech API (pip install -e '.[server]')",
                       description="Every option can also be set by its environment variable (in brackets after "
                                   "its help; CHATTTS_VELOCITY_ + the flag's name) or in a .env file in the working "
                                   "directory; a flag given here wins over both.")
    add_model_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="bind address (0.0.0.0 exposes the API on the network)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/* (better: set "
                                                   "CHATTTS_VELOCITY_API_KEY, which `ps` does not show)")
    p.add_argument("--api-keys-file", metavar="PATH", help="accept each key in PATH, one a line, each with optional "
                   "limits: KEY [max_queued=N] [max_queued_per_peer=N] (docs/reliability.md)")
    p.add_argument("--trusted-proxy", metavar="ADDR[,ADDR]", help="reverse proxies' addresses whose "
                   "X-Forwarded-For names the client (without it a client is its peer address)")
    p.add_argument("--allowed-origins", metavar="ORIGIN[,ORIGIN]", help="browser origins besides "
                   "the server's own that may send POST/DELETE (e.g. https://app.example; default: none)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the decode step (float32, or bf16/int8 where the C++ kernels are unavailable)")
    add_step_cap_flag(p)
    p.add_argument("--max-input-chars", type=int, metavar="N", help="longest input text (default 4096)")
    p.add_argument("--strict-instructions", action="store_true",
                   help="refuse (400) `instructions` outside the grammar of docs/voices.md instead of reading them as "
                        "free text and ignoring what no control matches")
    p.add_argument("--voices", metavar="DIR", help="the voice library folder (default $CHATTTS_VELOCITY_VOICES or "
                                                   "~/.cache/chattts_velocity/voices)")
    p.add_argument("--cache-mb", type=int, metavar="MB",
                   help="finished audio of seeded requests kept for identical repeats (default 64; 0: off)")
    p.add_argument("--chunk-steps", type=int, metavar="N", help="steps per streamed chunk (default 24 = 0.5 s)")
    p.add_argument("--first-chunk-steps", type=int, metavar="N", help="a stream's first chunk (default 4)")
    p.add_argument("--first-lookahead-steps", type=int, metavar="N",
                   help="its lookahead (default 24: 5e-7 from the whole-clip decode on demo weights; 16 is ~2e-4 off)")
    limits = p.add_argument_group("limits on what a client can make the server do (docs/reliability.md)")
    for name, (kind, text) in LIMIT_FLAGS.items():
        limits.add_argument(f"--{name.replace('_', '-')}", type=kind, metavar="N", help=text)
    g = p.add_argument_group("Ray Serve (needs the [ray] extra)")
    g.add_argument("--ray", action="store_true", help="run the API as Ray Serve replicas, one engine each")
    g.add_argument("--ray-address", default=None, help="join this Ray cluster; default: a private loopback cluster")
    scale = g.add_mutually_exclusive_group()
    scale.add_argument("--replicas", type=int, default=1, help="a fixed number of replicas")
    scale.add_argument("--autoscale", type=_min_max, default=None, metavar="MIN:MAX",
                       help="scale between MIN and MAX replicas on ongoing requests")
    g.add_argument("--replica-cpus", type=float, default=1.0, help="CPUs Ray reserves per replica (default 1)")
    g.add_argument("--replica-gpus", type=float, default=0.0, help="GPUs Ray reserves per replica (default 0)")
    g.add_argument("--max-ongoing-requests", type=int, default=256,
                   help="requests one replica takes at once; more wait in Ray's queue (default 256)")
    p.set_defaults(func=cmd_serve)
    add_env_defaults(p, settings_environment())  # every flag above also from CHATTTS_VELOCITY_<FLAG> or ./.env
