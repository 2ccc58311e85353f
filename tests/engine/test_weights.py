"""The GPT's weights in the engine's precision (engine/loading/weights.py): loaded in its weight dtype, packed."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity.assets import AssetPaths
from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.loading.weights import load_weights, pack_for
from chattts_velocity.model import PackedLinear
from chattts_velocity.precision import Precision


@pytest.mark.parametrize("dtype,weights", [("float32", torch.float32), ("int8", torch.bfloat16)])
def test_the_gpt_loads_in_the_precisions_weight_dtype_and_the_embed_in_float32(tiny_assets, dtype, weights) -> None:
    paths = AssetPaths.from_root(tiny_assets)
    config = ModelConfig.from_json(paths.gpt_config)
    model, embed = load_weights(paths, config, EngineConfig.from_kwargs(dtype=dtype))
    assert {p.dtype for p in model.parameters()} == {weights}
    assert {p.dtype for p in embed.parameters()} == {torch.float32}
    assert model.layers[0].self_attn.qkv_packed is None  # packing is pack_for's


@pytest.mark.parametrize("dtype,device,mode", [("float32", "cpu", None), ("int8", "cpu", "int8"),
                                               ("int4", "cpu", "int4"), ("bfloat16", "cuda", None)])
def test_pack_for_adds_the_linears_the_precision_runs(dtype: str, device: str, mode: str | None) -> None:
    from chattts_velocity.model import ChatTTSLlama

    model = ChatTTSLlama(ModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2))
    pack_for(model, Precision.decide(dtype, device=device))
    packed = model.layers[0].self_attn.qkv_packed
    assert (packed is None) == (mode is None)
    if mode is not None:
        assert isinstance(packed, PackedLinear) and packed.mode == mode
