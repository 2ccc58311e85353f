"""Demo fixtures: random weights and a tokenizer in the exact official `asset/` format, and `--model` resolution.

    python -m chattts_velocity.demo DIR [--tiny] [--seed N] [--force]
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from chattts_velocity.assets import DEMO_MARKER, OFFICIAL_SHA256, is_demo_folder
from chattts_velocity.demo.random_weights import DemoDims, write_demo_assets
from chattts_velocity.schema import MAX_NEW_TOKEN

__all__ = ["DEMO_MAX_NEW_TOKEN", "DemoDims", "cache_dir", "check_demo_target", "default_max_new_token",
           "demo_model_dir", "ensure_model", "is_demo_folder", "uses_demo_weights", "write_demo_assets"]

CACHE_ENV = "CHATTTS_VELOCITY_CACHE"
# Random demo weights rarely emit EOS, so every command caps each sentence on them (150 steps = 3.2 s of audio).
DEMO_MAX_NEW_TOKEN = 150


def cache_dir() -> Path:
    """$CHATTTS_VELOCITY_CACHE, else ~/.cache/chattts_velocity: one per user, wherever a command runs."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "chattts_velocity").expanduser()


def demo_model_dir(tiny: bool = False) -> Path:
    """Where `--model demo` keeps its random weights (written on first use)."""
    return cache_dir() / ("demo-tiny" if tiny else "demo")


def uses_demo_weights(model: str | Path) -> bool:
    """True for `--model demo` and for any folder carrying the demo marker (demo-weights.json)."""
    return str(model) == "demo" or is_demo_folder(Path(model).expanduser())


def default_max_new_token(model: str | Path) -> int:
    """Steps per sentence unless --max-new-token: DEMO_MAX_NEW_TOKEN on demo weights, else MAX_NEW_TOKEN (the
    library's default). The one rule: the CLI applies it to --model, the pipeline to the folder it loaded."""
    return DEMO_MAX_NEW_TOKEN if uses_demo_weights(model) else MAX_NEW_TOKEN


def ensure_model(model: str, tiny: bool = False, no_verify: bool = False, seed: int = 0) -> tuple[Path, bool]:
    """Resolve a `--model` value to (folder, verify).

    'demo' writes random demo weights to demo_model_dir() on first use. A folder written by demo-assets loads
    without the sha256 check (a one-line notice says so); any other folder is checked against the official files
    unless no_verify (custom or fine-tuned weights). A folder that does not exist is a ValueError naming --model.
    """
    if model == "demo":
        root = demo_model_dir(tiny)
        if is_demo_folder(root):
            print(f"note: --model demo: random demo weights from {root} (noise-like audio; see models/README.md)",
                  file=sys.stderr)
        else:
            print(f"writing random demo weights to {root} (noise-like audio; see models/README.md)", file=sys.stderr)
            write_demo_assets(root, seed=seed, tiny=tiny)
        return root, False
    root = Path(model).expanduser()
    if not root.is_dir():
        raise ValueError(f"--model: {root} is not a folder; give the folder that contains asset/, or 'demo'")
    if is_demo_folder(root):
        print(f"note: {root} holds random demo weights (chattts-velocity demo-assets); loading it unverified",
              file=sys.stderr)
        return root, False
    return root, not no_verify


def check_demo_target(root: str | Path, force: bool = False) -> None:
    """A ValueError unless root is free for demo weights: absent, empty, or holding only an earlier demo write.

    Official or fine-tuned weights have the same file names as demo ones; only the marker tells them apart, so a
    folder without it is refused (unless force) rather than overwritten.
    """
    root = Path(root).expanduser()
    if root.exists() and not root.is_dir():
        raise ValueError(f"demo-assets: {root} is a file; give a folder (it is created if missing)")
    if force or not root.exists():
        return
    ours = {*OFFICIAL_SHA256, f"asset/{DEMO_MARKER}"}
    found = sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())
    others = [rel for rel in found if rel not in ours] if is_demo_folder(root) else found
    if others:
        listed = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise ValueError(f"demo-assets: {root} already holds files that are not demo weights ({listed}); "
                         "pick a new or empty folder, or add --force to write over them")
