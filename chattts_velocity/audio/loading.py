"""Audio stage: read the audio checkpoints (safetensors -> fp32 state dict) and load them strictly.

Sizes are read from tensor shapes; a wrong or damaged file is reported as a ValueError naming the key.
"""
from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import torch
from torch import nn

from chattts_velocity.assets import check_state_dict, read_safetensors

M = TypeVar("M", bound=nn.Module)


def load_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a .safetensors file on CPU; floating tensors upcast to float32."""
    return {k: t.float() if t.is_floating_point() else t for k, t in read_safetensors(path, "checkpoint").items()}


def shape_of(sd: dict[str, torch.Tensor], key: str, what: str) -> torch.Size:
    """Shape of sd[key]; a missing key is a ValueError naming the file kind."""
    if key not in sd:
        raise ValueError(f"{what} state dict: missing key {key!r}; is this the right checkpoint file?")
    return sd[key].shape


def count_indexed(sd: dict[str, torch.Tensor], prefix: str, what: str) -> int:
    """Number of sub-modules `<prefix><j>.*` (j = 0..n-1, contiguous)."""
    heads = {k[len(prefix):].split(".", 1)[0] for k in sd if k.startswith(prefix)}
    found = {int(h) for h in heads if h.isdigit()}
    if not found or len(found) != len(heads) or found != set(range(len(found))):
        raise ValueError(
            f"{what} state dict: expected keys {prefix}0.* .. {prefix}<n-1>.*, got {sorted(heads)}"
        )
    return len(found)


def load_strict(module: M, sd: dict[str, torch.Tensor], what: str) -> M:
    """load_state_dict(strict=True), with missing/unexpected keys and shape mismatches as ValueError."""
    check_state_dict(f"{what} state dict", sd, module.state_dict(), f"; pass the official {what}.safetensors contents")
    module.load_state_dict(sd, strict=True)
    return module
