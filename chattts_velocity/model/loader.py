"""Checkpoint loading: asset/gpt/model.safetensors -> ChatTTSLlama, asset/Embed.safetensors -> Embed.

Loading is by name and strict; the only keys tolerated beyond the model's own are HF's unused
`embed_tokens.weight` and the never-used `rotary_emb.inv_freq` buffers.
"""
from __future__ import annotations

from pathlib import Path

import torch

from chattts_velocity.assets import check_state_dict, read_safetensors
from chattts_velocity.config import ModelConfig
from chattts_velocity.model.embed import Embed
from chattts_velocity.model.llama import ChatTTSLlama


def _ignored(key: str) -> bool:
    return key == "embed_tokens.weight" or key.endswith("rotary_emb.inv_freq")


def load_gpt(
    gpt_dir: str | Path,
    config: ModelConfig | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> ChatTTSLlama:
    """Build ChatTTSLlama from gpt_dir (model.safetensors, and config.json when config is None)."""
    path = Path(gpt_dir)
    file = path / "model.safetensors" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"gpt weights: {file} does not exist (expected asset/gpt/model.safetensors)")
    if config is None:
        config = ModelConfig.from_json(file.parent / "config.json")
    state_dict = {k: v for k, v in read_safetensors(file, "gpt weights").items() if not _ignored(k)}
    with torch.device("meta"):
        model = ChatTTSLlama(config)
    check_state_dict(f"gpt weights {file}", state_dict, model.state_dict(), "; is gpt/config.json this checkpoint's?")
    model.to_empty(device=device)
    model.load_state_dict(state_dict, strict=True)
    model = model.to(dtype=dtype)
    model.rotary_emb.float().reset_tables()  # RoPE tables stay fp32 (bf16 angles would drift with position)
    return model.eval()


def load_embed(
    path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> Embed:
    """Embed from asset/Embed.safetensors, sizes taken from the tensor shapes."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Embed weights: {path} does not exist (expected asset/Embed.safetensors)")
    return Embed.from_state_dict(read_safetensors(path, "Embed weights")).to(dtype=dtype, device=device).eval()


def gpt_state_dict(gpt_dir: str | Path) -> dict[str, torch.Tensor]:
    """asset/gpt/model.safetensors as fp32 tensors by HF key, without the ignored keys."""
    path = Path(gpt_dir)
    file = path / "model.safetensors" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"gpt weights: {file} does not exist (expected asset/gpt/model.safetensors)")
    return {k: v.float() for k, v in read_safetensors(file, "gpt weights").items() if not _ignored(k)}
