"""Malformed gpt/config.json and asset paths: one clear ValueError naming the file and the field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from chattts_velocity import Chat
from chattts_velocity.config import ModelConfig


@pytest.mark.parametrize("body,words", [
    ("garbage{", ["is not valid JSON"]),
    ("[1, 2]", ["must hold a JSON object", "list"]),
    (json.dumps({"num_attention_heads": "4"}), ["num_attention_heads must be an integer > 0", "'4'"]),
    (json.dumps({"hidden_size": True}), ["hidden_size must be an integer"]),
    (json.dumps({"rms_norm_eps": -1.0}), ["rms_norm_eps must be a number > 0"]),
    ('{"rope_theta": NaN}', ["rope_theta must be a number > 0"]),
    (json.dumps({"hidden_size": 100, "num_attention_heads": 12}), ["not a multiple of num_attention_heads"]),
    (json.dumps({"num_key_value_heads": 4}), ["grouped-query"]),
])
def test_bad_config_names_file_and_field(tmp_path: Path, body: str, words: list[str]) -> None:
    (tmp_path / "config.json").write_text(body, encoding="utf-8")
    with pytest.raises(ValueError) as err:
        ModelConfig.from_json(tmp_path)
    assert str(tmp_path / "config.json") in str(err.value)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_the_official_config_still_loads(tmp_path: Path) -> None:
    official = {"hidden_size": 768, "num_attention_heads": 12, "num_key_value_heads": 12, "rms_norm_eps": 1e-6,
                "rope_theta": 10000.0, "architectures": ["LlamaModel"], "rope_scaling": None}
    (tmp_path / "config.json").write_text(json.dumps(official), encoding="utf-8")
    assert ModelConfig.from_json(tmp_path).head_dim == 64


def test_a_custom_path_that_is_a_file_says_so(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"x")
    with pytest.raises(ValueError, match="custom_path: .* is a file; give the folder"):
        Chat().load(source="custom", custom_path=weights, verify=False)


@pytest.mark.parametrize("name", ["gpt/model.safetensors", "Embed.safetensors", "Vocos.safetensors"])
def test_a_damaged_checkpoint_names_its_file(tiny_assets: Path, tmp_path: Path, name: str) -> None:
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(tiny_assets, root)
    (root / "asset" / name).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ValueError) as err:
        Chat().load(source="custom", custom_path=root, verify=False, use_vllm=name != "gpt/model.safetensors")
    assert "is not a readable safetensors file" in str(err.value) and name.split("/")[-1] in str(err.value)
