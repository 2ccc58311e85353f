"""Demo weights: official keys/shapes/dtypes, determinism, config bytes, tokenizer, value scales."""
from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from chattts_velocity.assets import (
    OFFICIAL_SHA256,
    AssetError,
    AssetPaths,
    file_sha256,
    verify_assets,
)
from chattts_velocity.demo import tokenizer_files as demo_tokenizer
from chattts_velocity.demo.random_weights import (
    FULL_DIMS,
    TINY_DIMS,
    asset_shapes,
    atomic_write,
    gpt_config_text,
    write_demo_assets,
)

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "chattts-asset"
SAFETENSORS = [rel for rel in OFFICIAL_SHA256 if rel.endswith(".safetensors")]
# (tensors, parameters) per file, from spec sections 2.2-2.6
SPEC_COUNTS = {
    "asset/gpt/model.safetensors": (181, 188_775_168), "asset/Embed.safetensors": (15, 36_399_234),
    "asset/DVAE.safetensors": (242, 15_083_472), "asset/Decoder.safetensors": (115, 25_920_740),
    "asset/Vocos.safetensors": (83, 13_584_998),
}
SPEC_SHAPES = {  # spot checks copied from the spec tables
    "asset/gpt/model.safetensors": {"layers.19.mlp.down_proj.weight": (768, 3072), "norm.weight": (768,)},
    "asset/Embed.safetensors": {"emb_text.weight": (21178, 768), "head_code.3.parametrizations.weight.original0":
                                (626, 1), "head_text.parametrizations.weight.original1": (21178, 768)},
    "asset/DVAE.safetensors": {"coef": (1, 100, 1), "downsample_conv.2.weight": (512, 512, 4),
                               "preprocessor_mel.mel_spec.mel_scale.fb": (513, 100),
                               "encoder.conv_out.weight": (1024, 256, 1), "decoder.conv_out.weight": (512, 256, 1),
                               "encoder.decoder_block.11.weight": (256,), "out_conv.weight": (100, 512, 3),
                               "vq_layer.quantizer.rvqs.1.project_in.weight": (4, 512),
                               "vq_layer.quantizer.rvqs.0.project_out.bias": (512,)},
    "asset/Decoder.safetensors": {"decoder.conv_in.0.weight": (128, 384, 3), "decoder.conv_in.2.weight":
                                  (512, 128, 3), "decoder.decoder_block.11.pwconv1.weight": (2048, 512),
                                  "decoder.conv_out.weight": (384, 512, 1), "out_conv.weight": (100, 384, 3)},
    "asset/Vocos.safetensors": {"backbone.embed.weight": (512, 100, 7), "backbone.convnext.7.gamma": (512,),
                                "backbone.convnext.0.pwconv1.weight": (1536, 512), "head.out.weight": (1026, 512),
                                "head.istft.window": (1024,), "feature_extractor.mel_spec.spectrogram.window": (1024,)},
}
TINY_SHAPES = {  # the team brief's tiny sizes, written out by hand
    "asset/gpt/model.safetensors": {"layers.1.self_attn.k_proj.weight": (64, 64), "layers.1.mlp.up_proj.weight":
                                    (128, 64), "norm.weight": (64,)},
    "asset/Embed.safetensors": {"emb_text.weight": (21178, 64), "emb_code.3.weight": (626, 64),
                                "head_code.0.parametrizations.weight.original1": (626, 64)},
    "asset/DVAE.safetensors": {"downsample_conv.0.weight": (32, 100, 3), "downsample_conv.2.weight": (32, 32, 4),
                               "encoder.conv_in.0.weight": (16, 32, 3), "encoder.conv_in.2.weight": (32, 16, 3),
                               "encoder.decoder_block.1.pwconv1.weight": (128, 32), "encoder.conv_out.weight":
                               (64, 32, 1), "decoder.conv_out.weight": (32, 32, 1), "out_conv.weight": (100, 32, 3),
                               "vq_layer.quantizer.rvqs.1.project_in.weight": (4, 32),
                               "vq_layer.quantizer.rvqs.1.project_out.weight": (32, 4),
                               "preprocessor_mel.mel_spec.mel_scale.fb": (513, 100)},
    "asset/Decoder.safetensors": {"decoder.conv_in.0.weight": (16, 32, 3), "decoder.conv_out.weight": (32, 32, 1),
                                  "decoder.decoder_block.1.weight": (32,), "out_conv.weight": (100, 32, 3)},
    "asset/Vocos.safetensors": {"backbone.embed.weight": (32, 100, 7), "backbone.convnext.1.pwconv1.weight": (64, 32),
                                "head.out.weight": (1026, 32), "head.istft.window": (1024,)},
}
SPECIAL_IDS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103, "[Sasr]": 21128,
               "[Ebreak]": 21136, "[uv_break]": 21137, "[spk_emb]": 21143, "[break_0]": 21147, "[laugh_0]": 21155,
               "[oral_9]": 21167, "[speed_0]": 21168, "[speed_9]": 21177}


def _on_disk(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    with safe_open(str(path), framework="pt") as f:
        keys = list(f.keys())  # safe_open is not a dict: no `in f` iteration
        return {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in keys}


def _pattern(key: str) -> str:
    return re.sub(r"\.\d+\.", ".N.", key)


@pytest.fixture(scope="module")
def tiny_trees(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("demo")
    return {name: write_demo_assets(base / name, seed=seed, tiny=True, progress=False).root
            for name, seed in (("a", 0), ("b", 0), ("c", 1))}


def test_full_table_matches_spec_counts_and_shapes():
    tables = asset_shapes(FULL_DIMS)
    assert sorted(tables) == sorted(SAFETENSORS)
    for rel, (n_tensors, n_params) in SPEC_COUNTS.items():
        assert len(tables[rel]) == n_tensors, rel
        assert sum(math.prod(s) for s in tables[rel].values()) == n_params, rel
        for key, shape in SPEC_SHAPES[rel].items():
            assert tables[rel][key] == shape, key
    assert "embed_tokens.weight" not in tables["asset/gpt/model.safetensors"]


def test_tiny_table_has_the_full_key_patterns():
    full, tiny = asset_shapes(FULL_DIMS), asset_shapes(TINY_DIMS)
    for rel in SAFETENSORS:
        assert {_pattern(k) for k in tiny[rel]} == {_pattern(k) for k in full[rel]}, rel
        assert all(len(tiny[rel][k]) == len(full[rel][k]) for k in tiny[rel]), rel


def test_tiny_files_have_exact_keys_shapes_dtypes(tiny_trees):
    tables = asset_shapes(TINY_DIMS)
    for rel in SAFETENSORS:
        disk = _on_disk(tiny_trees["a"] / rel)
        assert {k: s for k, (s, _) in disk.items()} == tables[rel], rel
        assert {dtype for _, dtype in disk.values()} == {"F32"}, rel
        for key, shape in TINY_SHAPES[rel].items():
            assert disk[key][0] == shape, key


def test_same_seed_same_bytes_other_seed_other_bytes(tiny_trees):
    for rel in SAFETENSORS:
        a, b, c = (file_sha256(tiny_trees[n] / rel) for n in "abc")
        assert a == b and a != c, rel


def test_full_config_is_byte_identical_to_official():
    text = gpt_config_text(FULL_DIMS)
    assert len(text.encode()) == 762
    assert hashlib.sha256(text.encode()).hexdigest() == OFFICIAL_SHA256["asset/gpt/config.json"]


def test_tiny_config_loads_in_transformers_and_gpt_weights_fit(tiny_trees):
    transformers = pytest.importorskip("transformers")
    root = tiny_trees["a"]
    raw = json.loads((root / "asset/gpt/config.json").read_text())
    official = json.loads(gpt_config_text(FULL_DIMS))
    assert raw.keys() == official.keys()
    assert (raw["hidden_size"], raw["intermediate_size"], raw["num_hidden_layers"], raw["num_attention_heads"],
            raw["num_key_value_heads"]) == (64, 128, 2, 4, 4)
    _, info = transformers.LlamaModel.from_pretrained(str(root / "asset/gpt"), output_loading_info=True)
    # transformers 5 reports the keys as sets (4.x: lists)
    assert set(info["missing_keys"]) == {"embed_tokens.weight"} and not info["unexpected_keys"]


def test_value_scales(tiny_trees):
    from safetensors.torch import load_file

    asset = tiny_trees["a"] / "asset"
    dvae, vocos, embed = (load_file(str(asset / n)) for n in ("DVAE.safetensors", "Vocos.safetensors",
                                                               "Embed.safetensors"))
    n = torch.arange(1024, dtype=torch.float64)
    hann = 0.5 - 0.5 * torch.cos(2 * math.pi * n / 1024)  # periodic Hann
    for sd, key in ((vocos, "head.istft.window"), (dvae, "preprocessor_mel.mel_spec.spectrogram.window")):
        torch.testing.assert_close(sd[key].double(), hann, atol=1e-6, rtol=0)
    fb = dvae["preprocessor_mel.mel_spec.mel_scale.fb"]
    assert fb.min() >= 0 and fb.max() <= 1 and (fb.sum(0) > 0).all()
    assert 0.8 <= dvae["coef"].min() and dvae["coef"].max() <= 1.2
    assert 0.1 <= dvae["decoder.decoder_block.0.weight"].min() and vocos["backbone.convnext.1.gamma"].max() <= 0.5
    v = embed["head_code.2.parametrizations.weight.original1"]
    ratio = embed["head_code.2.parametrizations.weight.original0"] / v.norm(dim=1, keepdim=True)
    assert 0.8 <= ratio.min() and ratio.max() <= 1.2
    w = vocos["head.out.weight"][:513]
    worst = vocos["head.out.bias"][:513] + 6 * w.norm(dim=1)  # |LayerNorm output| per channel ~ 1
    assert worst.max() < math.log(100)  # exp(mag) stays below Vocos' clip at 100
    up = dvae["encoder.decoder_block.0.pwconv1.weight"]
    assert abs(up.std().item() * math.sqrt(up.shape[1]) - 1) < 0.1  # N(0, 1/fan_in)


def _tokenizer_ids(folder: Path) -> tuple[int, dict[str, int]]:
    transformers = pytest.importorskip("transformers")
    tok = transformers.BertTokenizerFast.from_pretrained(str(folder))
    return len(tok), {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_IDS}


def test_generated_tokenizer_loads_with_official_ids(tmp_path):
    assert demo_tokenizer.write_tokenizer(tmp_path, None, atomic_write) in ("copied", "generated")
    gen = tmp_path / "generated"
    original = demo_tokenizer.shared_tokenizer_dir
    demo_tokenizer.shared_tokenizer_dir = lambda: tmp_path / "absent"
    try:
        assert demo_tokenizer.write_tokenizer(gen, None, atomic_write) == "generated"
    finally:
        demo_tokenizer.shared_tokenizer_dir = original
    assert _tokenizer_ids(gen) == (21178, SPECIAL_IDS)
    if not (SHARED / "tokenizer" / "tokenizer.json").is_file():
        pytest.skip("real tokenizer absent: no byte comparison")
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        assert file_sha256(gen / name) == OFFICIAL_SHA256["asset/tokenizer/" + name]
    ours, real = (json.loads((d / "tokenizer.json").read_text()) for d in (gen, SHARED / "tokenizer"))
    assert {k: v for k, v in ours.items() if k != "model"} == {k: v for k, v in real.items() if k != "model"}
    assert {k: v for k, v in ours["model"].items() if k != "vocab"} == \
        {k: v for k, v in real["model"].items() if k != "vocab"}


def test_copied_tokenizer_is_the_official_one(tiny_trees):
    if not (SHARED / "tokenizer" / "tokenizer.json").is_file():
        pytest.skip("real tokenizer absent")
    for name in demo_tokenizer.TOKENIZER_FILES:
        assert file_sha256(tiny_trees["a"] / "asset/tokenizer" / name) == OFFICIAL_SHA256["asset/tokenizer/" + name]
    with pytest.raises(ValueError, match="tokenizer_src"):
        write_demo_assets(tiny_trees["a"].parent / "bad", tiny=True, tokenizer_src=tiny_trees["a"], progress=False)


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "x.safetensors"

    def half_write(p: Path) -> None:
        p.write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, half_write)
    assert list(tmp_path.iterdir()) == []


def test_demo_tree_fails_official_verification_only_on_weights(tiny_trees):
    with pytest.raises(AssetError) as info:
        verify_assets(AssetPaths.from_root(tiny_trees["a"]))
    assert info.value.missing == () and set(SAFETENSORS) <= set(info.value.mismatched)
    verify_assets(AssetPaths.from_root(tiny_trees["a"]), check_sha256=False)


@pytest.mark.slow
def test_full_write_matches_spec(tmp_path):
    paths = write_demo_assets(tmp_path, seed=0, progress=False)
    tables = asset_shapes(FULL_DIMS)
    for rel, (n_tensors, n_params) in SPEC_COUNTS.items():
        disk = _on_disk(tmp_path / rel)
        assert {k: s for k, (s, _) in disk.items()} == tables[rel] and len(disk) == n_tensors
        assert sum(math.prod(s) for s, _ in disk.values()) == n_params
        assert {d for _, d in disk.values()} == {"F32"}
    assert file_sha256(paths.gpt_config) == OFFICIAL_SHA256["asset/gpt/config.json"]


def test_the_python_api_applies_the_clis_demo_step_cap_unless_max_new_token_is_set(tiny_assets, tmp_path):
    from types import SimpleNamespace

    from chattts_velocity.demo import DEMO_MAX_NEW_TOKEN, default_max_new_token
    from chattts_velocity.params import InferCodeParams
    from chattts_velocity.speech.stages import Stages

    def capped(root: Path, *params: InferCodeParams) -> list[InferCodeParams]:
        loaded = SimpleNamespace(step_cap=default_max_new_token(root))  # as the pipeline's Stages decide it at load
        return Stages.step_capped(loaded, list(params))

    shared = InferCodeParams(manual_seed=3)
    first, second = capped(tiny_assets, shared, shared)
    assert first.max_new_token == DEMO_MAX_NEW_TOKEN == default_max_new_token(tiny_assets)
    assert first.manual_seed == 3 and first is second  # texts that shared params still share them (one voice decode)
    assert capped(tiny_assets, InferCodeParams(max_new_token=400))[0].max_new_token == 400
    assert capped(tmp_path, InferCodeParams())[0].max_new_token == InferCodeParams.max_new_token
