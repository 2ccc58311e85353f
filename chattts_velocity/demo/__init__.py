"""Demo fixtures: random weights and a tokenizer in the exact official `asset/` format, and `--model` resolution.

    python -m chattts_velocity.demo models/demo [--tiny] [--seed N]
"""
from __future__ import annotations

import sys
from pathlib import Path

from chattts_velocity.assets import is_demo_folder
from chattts_velocity.demo.weights import DemoDims, write_demo_assets

__all__ = ["DEMO_MAX_NEW_TOKEN", "DemoDims", "demo_model_dir", "ensure_model", "is_demo_folder",
           "write_demo_assets"]

# Random demo weights rarely emit EOS, so commands cap each sentence on them (150 steps = 3.2 s of audio).
DEMO_MAX_NEW_TOKEN = 150


def demo_model_dir(tiny: bool = False) -> Path:
    return Path("models") / ("demo-tiny" if tiny else "demo")


def ensure_model(model: str, tiny: bool = False, no_verify: bool = False, seed: int = 0) -> tuple[Path, bool]:
    """Resolve a `--model` value to (folder, verify).

    'demo' writes random demo weights on first use. A folder written by demo-assets loads without the sha256
    check (a one-line notice says so); any other folder is checked against the official files unless
    no_verify (custom or fine-tuned weights). A folder that does not exist is a ValueError naming --model.
    """
    if model == "demo":
        root = demo_model_dir(tiny)
        if not is_demo_folder(root):
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
