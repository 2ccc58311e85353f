"""Demo fixtures: random weights and a tokenizer in the exact official `asset/` format, and the `--model demo` folder.

    python -m chattts_velocity.demo models/demo [--tiny] [--seed N]
"""
from __future__ import annotations

import sys
from pathlib import Path

from chattts_velocity.demo.weights import DemoDims, write_demo_assets

__all__ = ["DEMO_MAX_NEW_TOKEN", "DemoDims", "demo_model_dir", "ensure_model", "write_demo_assets"]

# Random demo weights rarely emit EOS, so commands cap each sentence on them (150 steps = 3.2 s of audio).
DEMO_MAX_NEW_TOKEN = 150


def demo_model_dir(tiny: bool = False) -> Path:
    return Path("models") / ("demo-tiny" if tiny else "demo")


def ensure_model(model: str, tiny: bool = False, seed: int = 0) -> tuple[Path, bool]:
    """Resolve a `--model` value: 'demo' writes random demo weights on first use. Returns (dir, verify)."""
    if model != "demo":
        path = Path(model)
        if not path.exists():
            raise SystemExit(f"--model: {path} does not exist (give an asset folder or 'demo')")
        return path, True
    root = demo_model_dir(tiny)
    if not (root / "asset" / "Vocos.safetensors").exists():
        print(f"writing random demo weights to {root} (noise-like audio; see models/README.md)", file=sys.stderr)
        write_demo_assets(root, seed=seed, tiny=tiny)
    return root, False
