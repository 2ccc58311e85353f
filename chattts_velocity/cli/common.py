"""What every command shares: the model flags and a loaded Chat from them."""
from __future__ import annotations

import argparse
import socket
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from .. import precision
from ..assets import AssetError
from ..chat import Chat
from ..config import BACKENDS
from ..demo import DEMO_MAX_NEW_TOKEN, default_max_new_token, ensure_model
from ..schema import MAX_NEW_TOKEN

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]  # what add_subparsers returns

PACKAGE_DIR = Path(__file__).resolve().parents[1]

DTYPES = list(precision.DTYPE_CHOICES)


def resolve_dtype(args: argparse.Namespace) -> str:
    """--dtype for a load in other processes (Ray): auto -> the fastest precision on this host (decide_here, the
    one decision of every load), said once on stderr. A load here decides it itself (load_chat)."""
    from ..engine.loading.host import decide_here

    if args.dtype == "auto":
        args.dtype = decide_here("auto", device=None).dtype
        say_auto(args.dtype)
    dtype: str = args.dtype
    return dtype


def say_auto(dtype: str) -> None:
    print(f"precision: {dtype} (the fastest measured here; --dtype float32 for exact runs)", file=sys.stderr)


def load_line(chat: Chat) -> str:
    """What a loaded Chat runs: every stage's precision, the decode backend and, on the cpu backend, the kernels'
    ISA path."""
    from ..model import kernels

    precision = chat.pipeline.precision.describe()
    if not chat.default_use_vllm:
        return f"loaded: {precision}; plain path (torch)"
    backend = chat.engine().runner.backend.name
    path = f", kernels {kernels.kernel_path()}" if backend == "cpu" else ""
    return f"loaded: {precision}; decode backend {backend}{path}"


def add_model_flags(p: argparse.ArgumentParser, default_dtype: str = "auto") -> None:
    """--model, --tiny, --no-verify, --dtype, --backend and --kv-cache-dtype: the same on every command that loads
    a model."""
    p.add_argument("--model", default="demo", metavar="DIR|demo",
                   help="asset folder (the one that contains asset/), or 'demo' (default): random demo weights, "
                        "written on first use to $CHATTTS_VELOCITY_CACHE/demo (default ~/.cache/chattts_velocity/demo)")
    p.add_argument("--tiny", action="store_true", help="with --model demo: test-size weights")
    p.add_argument("--no-verify", action="store_true",
                   help="load custom or fine-tuned weights without the official sha256 check")
    p.add_argument("--dtype", default=default_dtype, choices=DTYPES,
                   help="auto (default): int8 where our CPU kernels run, bfloat16 on CUDA, else float32; float32 is "
                        "exact; int4 is the fastest single stream at lower quality")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="the engine's decode backend: auto (triton on CUDA, the fused C++ layers on capable CPUs, "
                        "else torch), or one of them (an error where it cannot run)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=precision.KV_CACHE_DTYPES,
                   help="auto: the KV cache in the engine's precision; int8: about half the bytes per cached position "
                        "(bfloat16/int8 engines on the fused C++ layers; docs/performance.md section 9)")


def add_step_cap_flag(p: argparse.ArgumentParser) -> None:
    """--max-new-token, the same default on every command (max_new_token(args) resolves it)."""
    p.add_argument("--max-new-token", type=int, default=None, metavar="N",
                   help=f"cap on audio steps per sentence (default {MAX_NEW_TOKEN}; "
                        f"{DEMO_MAX_NEW_TOKEN} on demo weights, which rarely stop by themselves)")


def max_new_token(args: argparse.Namespace) -> int:
    """--max-new-token, else the cap for the weights --model names (demo weights by their marker)."""
    return default_max_new_token(args.model) if args.max_new_token is None else args.max_new_token


def check_backend(args: argparse.Namespace) -> None:
    """--backend cpu or triton where it cannot run: one line naming the real cause and the fix, before the model
    loads."""
    if args.backend == "triton":
        check_triton()
    if args.backend != "cpu":
        return
    from ..model import kernels

    reason = kernels.unsupported()
    if reason is not None:
        raise ValueError(f"--backend cpu: its fused C++ layers cannot run on this machine ({reason}); "
                         "use --backend auto or torch")
    if args.dtype == "float32":
        raise ValueError("--backend cpu: its fused C++ layers run in bfloat16 or int8; add --dtype bfloat16 "
                         "(or int8), or use --backend torch for float32")


def check_triton() -> None:
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        raise ValueError("--backend triton: its kernels run on an NVIDIA GPU and torch sees none here; use "
                         "--backend auto, cpu or torch")
    if importlib.util.find_spec("triton") is None:
        raise ValueError("--backend triton: the triton package is not installed (pip install -e '.[triton]'); "
                         "or use --backend auto or torch")


def check_writable(path: Path, flag: str) -> None:
    """A file the command will write: a one-line ValueError naming the flag now, before any synthesis, if it cannot
    be created or written (a file created to find out is removed again)."""
    existed = path.exists()
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise ValueError(f"{flag}: cannot write {path} ({exc.strerror}); nothing was synthesised") from None
    if not existed:
        path.unlink()


_SHOW_WARNING = warnings.formatwarning  # Python's own, for warnings raised outside the package


def _format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                    line: str | None = None) -> str:
    if Path(filename).resolve().is_relative_to(PACKAGE_DIR):
        return f"warning: {message}\n"
    return _SHOW_WARNING(message, category, filename, lineno, line)


def package_warnings_in_one_line() -> None:
    """The package's own warnings print as `warning: ...` (no category, no source line); others as usual."""
    warnings.formatwarning = _format_warning


class EngineOptions(TypedDict, total=False):
    backend: str
    kv_cache_dtype: str


def engine_options(args: argparse.Namespace) -> EngineOptions:
    """The engine's options among the model flags, as Chat.load takes them (here or in a Ray worker)."""
    return {"backend": args.backend, "kv_cache_dtype": args.kv_cache_dtype}


def model_folder(args: argparse.Namespace) -> tuple[Path, bool]:
    """(folder, verify) from the model flags, for loaders here or in other processes (Ray); a --backend that
    cannot run here fails first."""
    check_backend(args)
    return ensure_model(args.model, args.tiny, args.no_verify)


def seed_speakers(args: argparse.Namespace) -> Callable[[int], str]:
    """seed -> the speaker string the model of the flags draws for it (Chat.sample_random_speaker(seed=...) on the
    device Chat.load picks), read from its config alone: the export resolves presets and seeds before it loads."""
    from ..assets import AssetPaths
    from ..config import ModelConfig
    from ..precision import resolve_device
    from ..text import sample_random_speaker

    def draw(seed: int) -> str:
        if not hasattr(args, "hidden_size"):
            args.hidden_size = ModelConfig.from_json(AssetPaths.from_root(model_folder(args)[0]).gpt_config).hidden_size
        return sample_random_speaker(args.hidden_size, device=resolve_device(None), seed=seed)

    return draw


def load_chat(args: argparse.Namespace, use_vllm: bool = True, compile: bool = False) -> Chat:
    """A loaded Chat from the model flags; a folder that is not the official files is refused in one line."""
    root, verify = model_folder(args)
    chat = Chat()
    engine = engine_options(args) if use_vllm else EngineOptions()  # the plain path has no backends
    try:
        chat.load(source="custom", custom_path=root, verify=verify, use_vllm=use_vllm, dtype=args.dtype,
                  compile=compile, **engine)
    except AssetError as exc:
        what = (f"missing {', '.join(exc.missing)}" if exc.missing else
                f"sha256 differs for {', '.join(exc.mismatched)}")
        hint = "; for custom or fine-tuned weights add --no-verify" if not exc.missing else ""
        raise ValueError(f"--model {root}: not the official ChatTTS files ({what}){hint}") from None
    if args.dtype == "auto":  # decided by the load, once: what it chose
        args.dtype = chat.pipeline.precision.dtype
        say_auto(args.dtype)
    print(load_line(chat), file=sys.stderr)
    return chat


def check_port_free(host: str, port: int) -> None:
    """A one-line error now rather than a server traceback after the model has loaded."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ValueError(f"--port: cannot listen on {host}:{port} ({exc.strerror}); is another server "
                             "running there? pick another --port") from None

