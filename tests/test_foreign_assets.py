"""Assets in the official format but written by another tool load and give the same audio."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from safetensors.torch import load_file

from chattts_velocity import Chat, InferCodeParams
from chattts_velocity.audio import DVAE, Decoder, Vocos, load_safetensors
from chattts_velocity.model import load_embed, load_gpt

FILES = ["Decoder.safetensors", "DVAE.safetensors", "Embed.safetensors", "Vocos.safetensors", "gpt/model.safetensors"]


def _rewrite(src: Path, dst: Path) -> None:
    """Re-save every tensor with the numpy writer, keys reversed, plus what old checkpoints carried."""
    shutil.copytree(src, dst)
    for rel in FILES:
        tensors = load_file(str(src / "asset" / rel))
        arrays = {k: tensors[k].numpy() for k in sorted(tensors, reverse=True)}
        if rel.startswith("gpt/"):  # older ChatTTS files kept the unused HF token table
            hidden = tensors["norm.weight"].shape[0]
            arrays["embed_tokens.weight"] = np.zeros((32000, hidden), np.float32)
        save_file(arrays, str(dst / "asset" / rel), metadata={"writer": "numpy"})


@pytest.fixture(scope="module")
def foreign(tiny_assets, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("foreign") / "tiny"
    _rewrite(tiny_assets, root)
    return root


def test_every_demo_file_loads_strictly(tiny_assets: Path) -> None:
    asset = tiny_assets / "asset"
    Decoder.from_state_dict(load_safetensors(asset / "Decoder.safetensors"))
    DVAE.from_state_dict(load_safetensors(asset / "DVAE.safetensors"))
    Vocos.from_state_dict(load_safetensors(asset / "Vocos.safetensors"))
    load_embed(asset / "Embed.safetensors")
    load_gpt(asset / "gpt")


def test_foreign_writer_gives_identical_audio(tiny_assets: Path, foreign: Path) -> None:
    params = InferCodeParams(manual_seed=5, max_new_token=8, min_new_token=8, show_tqdm=False)
    wavs = []
    for root in (tiny_assets, foreign):
        chat = Chat()
        chat.load(source="custom", custom_path=root, verify=False)
        wavs.append(chat.infer(["Hello there."], skip_refine_text=True, params_infer_code=params, use_vllm=True)[0])
    np.testing.assert_array_equal(wavs[0], wavs[1])


def test_half_precision_files_are_upcast(tiny_assets: Path, tmp_path: Path) -> None:
    path = tmp_path / "Vocos.safetensors"
    tensors = load_file(str(tiny_assets / "asset" / "Vocos.safetensors"))
    save_file({k: v.half().numpy() for k, v in tensors.items()}, str(path))
    vocos = Vocos.from_state_dict(load_safetensors(path))
    assert all(p.dtype == torch.float32 for p in vocos.parameters())
