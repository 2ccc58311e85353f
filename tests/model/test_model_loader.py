"""load_gpt / load_embed: strict by-name loading from the official file layout."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from chattts_velocity.config import ModelConfig
from chattts_velocity.model import (
    ChatTTSLlama,
    Embed,
    allocate_kv_pairs,
    build_attention_metadata,
    load_embed,
    load_gpt,
)


def write_gpt_dir(tmp_path, state: dict[str, torch.Tensor], cfg: ModelConfig):
    gpt_dir = tmp_path / "gpt"
    gpt_dir.mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(gpt_dir / "model.safetensors"))
    (gpt_dir / "config.json").write_text(json.dumps({**asdict(cfg), "model_type": "llama"}))
    return gpt_dir


def hidden_of(model, x: torch.Tensor) -> torch.Tensor:
    cfg = model.config
    kv = allocate_kv_pairs(cfg.num_hidden_layers, 2, 16, cfg.num_attention_heads, cfg.head_dim)
    meta = build_attention_metadata([x.shape[0]], [x.shape[0]], [[1]], 16)
    with torch.no_grad():
        return model(x, meta.positions, kv, meta)


@pytest.mark.parametrize("keep_embed_tokens", [True, False])
def test_load_gpt_with_or_without_embed_tokens(tmp_path, hf_llama, keep_embed_tokens, tiny_config):
    state = dict(hf_llama.state_dict())
    if not keep_embed_tokens:
        del state["embed_tokens.weight"]
    state["rotary_emb.inv_freq"] = torch.ones(8)  # never stored upstream, but tolerated
    model = load_gpt(write_gpt_dir(tmp_path, state, tiny_config))  # config read from gpt/config.json
    assert model.config == tiny_config
    loaded = model.state_dict()
    for key, value in hf_llama.state_dict().items():
        if key != "embed_tokens.weight":
            assert torch.equal(loaded[key], value), key
    x = torch.randn(7, tiny_config.hidden_size)
    with torch.no_grad():
        expected = hf_llama(inputs_embeds=x[None]).last_hidden_state[0]
    assert (hidden_of(model, x) - expected).abs().max().item() <= 1e-5


def test_load_gpt_rejects_unexpected_and_missing_keys(tmp_path, hf_llama, tiny_config):
    state = dict(hf_llama.state_dict())
    state["layers.0.self_attn.qkv_proj.weight"] = torch.zeros(3)
    del state["layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match=r"missing keys \['layers.1.mlp.up_proj.weight'\].*qkv_proj"):
        load_gpt(write_gpt_dir(tmp_path, state, tiny_config), tiny_config)


def test_load_gpt_rejects_shapes_that_disagree_with_config(tmp_path, hf_llama, tiny_config):
    state = {k: v for k, v in hf_llama.state_dict().items()}
    state["norm.weight"] = torch.ones(tiny_config.hidden_size + 1)
    with pytest.raises(ValueError, match="norm.weight"):
        load_gpt(write_gpt_dir(tmp_path, state, tiny_config), tiny_config)


def test_load_gpt_dtype(tmp_path, hf_llama, tiny_config):
    gpt_dir = write_gpt_dir(tmp_path, dict(hf_llama.state_dict()), tiny_config)
    model = load_gpt(gpt_dir, tiny_config, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.equal(model.layers[0].mlp.up_proj.weight, hf_llama.layers[0].mlp.up_proj.weight.bfloat16())


def test_missing_files_raise(tmp_path, tiny_config):
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_gpt(tmp_path, tiny_config)
    with pytest.raises(FileNotFoundError, match="Embed"):
        load_embed(tmp_path / "Embed.safetensors")


def test_load_embed_roundtrip(tmp_path, tiny_config):
    torch.manual_seed(0)
    source = Embed(tiny_config.hidden_size, 626, 21178, 4)
    path = tmp_path / "Embed.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    loaded = load_embed(path)
    for key, value in source.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    h = torch.randn(2, tiny_config.hidden_size)
    with torch.no_grad():
        assert torch.equal(loaded.code_logits(h)[:, 2], source.head_code[2](h))


ASSET = Path(__file__).resolve().parents[2] / ".." / "shared" / "chattts-asset"


@pytest.mark.skipif(not (ASSET / "gpt" / "config.json").is_file(), reason="shared chattts-asset not present")
def test_full_size_parameter_names_and_count_follow_spec():
    cfg = ModelConfig.from_json(ASSET / "gpt" / "config.json")
    with torch.device("meta"):
        model = ChatTTSLlama(cfg)
    per_layer = {
        "self_attn.q_proj.weight": (768, 768), "self_attn.k_proj.weight": (768, 768),
        "self_attn.v_proj.weight": (768, 768), "self_attn.o_proj.weight": (768, 768),
        "mlp.gate_proj.weight": (3072, 768), "mlp.up_proj.weight": (3072, 768), "mlp.down_proj.weight": (768, 3072),
        "input_layernorm.weight": (768,), "post_attention_layernorm.weight": (768,),
    }
    expected = {f"layers.{i}.{k}": s for i in range(20) for k, s in per_layer.items()} | {"norm.weight": (768,)}
    got = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert got == expected
    assert sum(v.numel() for v in model.state_dict().values()) == 188_775_168
