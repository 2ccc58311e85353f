"""Demo checkpoint: random weights written in the exact official `asset/` format (keys, shapes, fp32).

In: a folder, a seed and full/tiny sizes. Out: root/asset/... loadable like the official files; the
pipeline then makes finite, noise-like audio. `python -m chattts_velocity.demo DIR [--tiny]`.
"""
from __future__ import annotations

import functools
import json
import math
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from chattts_velocity.assets import DEMO_KIND, DEMO_MARKER, AssetPaths
from chattts_velocity.audio.mel import htk_mel_filterbank
from chattts_velocity.audio.wav import SAMPLE_RATE
from chattts_velocity.demo.tokenizer_files import write_tokenizer

Shapes = dict[str, tuple[int, ...]]
TEXT_EOS_ID = 21136  # [Ebreak]: its head row gets a larger gain so random refine-text ends after ~10 tokens
MAG_BIAS = 0.5  # Vocos head log-magnitude bias: exp(0.5 +- 4 * 0.5) <= ~12, far below the 100 clip
MAG_STD = 0.5  # std of the log-magnitude logits around MAG_BIAS


@dataclass(frozen=True)
class DemoDims:
    """Every size of the checkpoint. FULL_DIMS is the official one, TINY_DIMS the test size."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    dvae_dim: int  # DVAE conv width: downsample_conv, decoder idim/odim, GFSQ group width
    dvae_hidden: int
    dvae_bn_dim: int
    dvae_layers: int
    decoder_hidden: int  # Decoder.safetensors; its idim/odim is hidden_size // 2
    decoder_bn_dim: int
    decoder_layers: int
    vocos_dim: int
    vocos_intermediate: int
    vocos_layers: int
    num_text_tokens: int = 21178
    num_audio_tokens: int = 626
    num_vq: int = 4
    n_mels: int = 100
    n_fft: int = 1024
    sample_rate: int = SAMPLE_RATE
    vq_groups: int = 2
    vq_codebook_dim: int = 4  # len(levels (5, 5, 5, 5))


FULL_DIMS = DemoDims(768, 3072, 20, 12, 12, 512, 256, 128, 12, 512, 128, 12, 512, 1536, 8)
TINY_DIMS = DemoDims(64, 128, 2, 4, 4, 32, 32, 16, 2, 32, 16, 2, 32, 64, 2)


def gpt_config_dict(dims: DemoDims) -> dict[str, object]:
    """The official asset/gpt/config.json fields with the sizes of `dims`."""
    return {
        "architectures": ["LlamaModel"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": dims.hidden_size,
        "initializer_range": 0.02, "intermediate_size": dims.intermediate_size,
        "max_position_embeddings": 4096, "mlp_bias": False, "model_type": "llama",
        "num_attention_heads": dims.num_attention_heads, "num_audio_tokens": dims.num_audio_tokens,
        "num_hidden_layers": dims.num_hidden_layers, "num_key_value_heads": dims.num_key_value_heads,
        "num_text_tokens": dims.num_text_tokens, "num_vq": dims.num_vq, "pretraining_tp": 1,
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000.0, "spk_KL": False,
        "spk_emb_dim": 192, "tie_word_embeddings": False, "torch_dtype": "float32",
        "transformers_version": "4.41.2", "use_cache": False, "vocab_size": 32000,
    }


def gpt_config_text(dims: DemoDims) -> str:
    # 2-space indent, sorted keys, trailing newline: byte-identical to the official file for FULL_DIMS
    return json.dumps(gpt_config_dict(dims), indent=2, sort_keys=True) + "\n"


def _gpt_shapes(d: DemoDims) -> Shapes:
    h, i = d.hidden_size, d.intermediate_size
    kv = d.num_key_value_heads * (h // d.num_attention_heads)
    out: Shapes = {}
    for n in range(d.num_hidden_layers):
        p = f"layers.{n}."
        out |= {p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
                p + "mlp.down_proj.weight": (h, i), p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,)}
    return out | {"norm.weight": (h,)}  # no embed_tokens: the official loaders ignore it


def _embed_shapes(d: DemoDims) -> Shapes:
    h, a, t = d.hidden_size, d.num_audio_tokens, d.num_text_tokens
    out: Shapes = {f"emb_code.{q}.weight": (a, h) for q in range(d.num_vq)}
    out |= {"emb_text.weight": (t, h), "head_text.parametrizations.weight.original0": (t, 1),
            "head_text.parametrizations.weight.original1": (t, h)}
    for q in range(d.num_vq):
        out |= {f"head_code.{q}.parametrizations.weight.original0": (a, 1),
                f"head_code.{q}.parametrizations.weight.original1": (a, h)}
    return out


def _convnext_shapes(p: str, dim: int, inter: int, scale_name: str) -> Shapes:
    return {p + scale_name: (dim,), p + "dwconv.weight": (dim, 1, 7), p + "dwconv.bias": (dim,),
            p + "norm.weight": (dim,), p + "norm.bias": (dim,), p + "pwconv1.weight": (inter, dim),
            p + "pwconv1.bias": (inter,), p + "pwconv2.weight": (dim, inter), p + "pwconv2.bias": (dim,)}


def _conv_net_shapes(p: str, idim: int, odim: int, hidden: int, bn_dim: int, n_layer: int) -> Shapes:
    """DVAEDecoder (upstream's layout): conv_in (k3, GELU, k3), n_layer ConvNeXt blocks, conv_out (k1, no bias)."""
    out: Shapes = {p + "conv_in.0.weight": (bn_dim, idim, 3), p + "conv_in.0.bias": (bn_dim,),
                   p + "conv_in.2.weight": (hidden, bn_dim, 3), p + "conv_in.2.bias": (hidden,)}
    for j in range(n_layer):
        out |= _convnext_shapes(f"{p}decoder_block.{j}.", hidden, 4 * hidden, "weight")
    return out | {p + "conv_out.weight": (odim, hidden, 1)}


def _mel_shapes(p: str, d: DemoDims) -> Shapes:
    return {p + "spectrogram.window": (d.n_fft,), p + "mel_scale.fb": (d.n_fft // 2 + 1, d.n_mels)}


def _dvae_shapes(d: DemoDims) -> Shapes:
    dim, m, cd = d.dvae_dim, d.n_mels, d.vq_codebook_dim
    out: Shapes = {"coef": (1, m, 1), "downsample_conv.0.weight": (dim, m, 3), "downsample_conv.0.bias": (dim,),
                   "downsample_conv.2.weight": (dim, dim, 4), "downsample_conv.2.bias": (dim,)}
    out |= _mel_shapes("preprocessor_mel.mel_spec.", d)
    out |= _conv_net_shapes("encoder.", dim, d.vq_groups * dim, d.dvae_hidden, d.dvae_bn_dim, d.dvae_layers)
    out |= _conv_net_shapes("decoder.", dim, dim, d.dvae_hidden, d.dvae_bn_dim, d.dvae_layers)
    out["out_conv.weight"] = (m, dim, 3)
    for g in range(d.vq_groups):
        p = f"vq_layer.quantizer.rvqs.{g}."
        out |= {p + "project_in.weight": (cd, dim), p + "project_in.bias": (cd,),
                p + "project_out.weight": (dim, cd), p + "project_out.bias": (dim,)}
    return out


def _decoder_shapes(d: DemoDims) -> Shapes:
    idim = d.hidden_size // 2  # one GPT hidden = 2 mel frames of hidden/2 channels each
    out: Shapes = {"coef": (1, d.n_mels, 1)}
    out |= _conv_net_shapes("decoder.", idim, idim, d.decoder_hidden, d.decoder_bn_dim, d.decoder_layers)
    return out | {"out_conv.weight": (d.n_mels, idim, 3)}


def _vocos_shapes(d: DemoDims) -> Shapes:
    v = d.vocos_dim
    out = _mel_shapes("feature_extractor.mel_spec.", d)
    out |= {"backbone.embed.weight": (v, d.n_mels, 7), "backbone.embed.bias": (v,),
            "backbone.norm.weight": (v,), "backbone.norm.bias": (v,)}
    for k in range(d.vocos_layers):
        out |= _convnext_shapes(f"backbone.convnext.{k}.", v, d.vocos_intermediate, "gamma")
    return out | {"backbone.final_layer_norm.weight": (v,), "backbone.final_layer_norm.bias": (v,),
                  "head.out.weight": (d.n_fft + 2, v), "head.out.bias": (d.n_fft + 2,),
                  "head.istft.window": (d.n_fft,)}


def asset_shapes(dims: DemoDims) -> dict[str, Shapes]:
    """Relative file -> {key: shape} of every safetensors file; Vocos last (its presence marks a full write)."""
    return {"asset/gpt/model.safetensors": _gpt_shapes(dims), "asset/Embed.safetensors": _embed_shapes(dims),
            "asset/DVAE.safetensors": _dvae_shapes(dims), "asset/Decoder.safetensors": _decoder_shapes(dims),
            "asset/Vocos.safetensors": _vocos_shapes(dims)}


def _tensor_seed(seed: int, rel: str, key: str) -> int:
    # per-tensor seeds: a tensor's values depend only on (seed, file, key), not on write order
    return (seed * 0x9E3779B97F4A7C15 + zlib.crc32(f"{rel}:{key}".encode())) % (1 << 63)


def _is_norm(key: str) -> bool:
    return "norm." in key  # LayerNorm / RMSNorm: *.norm.*, *_layernorm.*, final_layer_norm.*, norm.weight


def _is_layer_scale(key: str) -> bool:
    return key.endswith(".gamma") or (".decoder_block." in key and key.count(".") == 3 and key.endswith(".weight"))


def init_tensor(key: str, shape: tuple[int, ...], gen: torch.Generator, dims: DemoDims) -> torch.Tensor:
    """Well-scaled values for one key: unit-variance activations, fixed DSP buffers, tame layer scales."""
    if key.endswith(".window"):
        return torch.hann_window(shape[0], periodic=True)
    if key.endswith(".fb"):
        return htk_mel_filterbank(shape[0], shape[1], dims.sample_rate)
    if key == "coef":
        return 0.8 + 0.4 * torch.rand(shape, generator=gen)
    if _is_norm(key):  # near 1 / near 0 rather than exactly, so a dropped norm parameter shows in parity tests
        noise = torch.randn(shape, generator=gen)
        return 1.0 + 0.05 * noise if key.endswith(".weight") else 0.02 * noise
    if _is_layer_scale(key):
        return 0.1 + 0.4 * torch.rand(shape, generator=gen)
    if key.startswith("head.out."):
        return _vocos_head(key, shape, gen)
    if key.endswith(".original0"):  # replaced by _weight_norm_gains once original1 exists
        return 0.8 + 0.4 * torch.rand(shape, generator=gen)
    if key.startswith("emb_"):
        return torch.randn(shape, generator=gen)
    if key.endswith(".bias"):
        return 0.02 * torch.randn(shape, generator=gen)
    return torch.randn(shape, generator=gen) / math.sqrt(math.prod(shape[1:]))  # [out, in, k]: N(0, 1/fan_in)


def _vocos_head(key: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    # rows [0, F): log-magnitude, rows [F, 2F): phase (F = n_fft/2 + 1)
    f = shape[0] // 2
    x = torch.randn(shape, generator=gen)
    if key.endswith(".bias"):
        return torch.cat([MAG_BIAS + 0.02 * x[:f], 0.02 * x[f:]])
    mag = x[:f] * (MAG_STD / x[:f].norm(dim=1, keepdim=True))  # unit-RMS input -> log-mag std MAG_STD
    return torch.cat([mag, x[f:] * (math.pi / math.sqrt(shape[1]))])  # phases spread over the circle


def _weight_norm_gains(tensors: dict[str, torch.Tensor]) -> None:
    """g = ||v||_row * factor, so the effective head weight is v * factor (logits of std ~1)."""
    for key in [k for k in tensors if k.endswith(".original0")]:
        v = tensors[key[: -len("0")] + "1"]  # [out, in]
        g = v.norm(dim=1, keepdim=True) * tensors[key]  # [out, 1]
        if key.startswith("head_text.") and g.shape[0] > TEXT_EOS_ID:
            g[TEXT_EOS_ID] *= 3.0
        tensors[key] = g


def build_file(rel: str, shapes: Shapes, seed: int, dims: DemoDims,
               tick: Callable[[int], object]) -> dict[str, torch.Tensor]:
    """All tensors of one safetensors file, float32, contiguous."""
    tensors: dict[str, torch.Tensor] = {}
    gen = torch.Generator(device="cpu")
    for key, shape in shapes.items():
        gen.manual_seed(_tensor_seed(seed, rel, key))
        tensors[key] = init_tensor(key, shape, gen, dims).to(torch.float32).reshape(shape).contiguous()
        tick(math.prod(shape))
    _weight_norm_gains(tensors)
    return tensors


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """write(tmp) then rename onto `path`: an interrupted run never leaves a complete-looking file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        tmp.chmod(0o644)  # some writers create 0600 files
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_demo_assets(
    root: str | Path, seed: int = 0, tiny: bool = False, tokenizer_src: str | Path | None = None,
    progress: bool = True,
) -> AssetPaths:
    """Write root/asset/... (random weights, official format); the tokenizer is copied or generated."""
    dims = TINY_DIMS if tiny else FULL_DIMS
    asset = Path(root).expanduser() / "asset"
    atomic_write(asset / "gpt" / "config.json", lambda p: p.write_text(gpt_config_text(dims), encoding="utf-8"))
    write_tokenizer(asset / "tokenizer", tokenizer_src, atomic_write)
    tables = asset_shapes(dims)
    total = sum(math.prod(s) for shapes in tables.values() for s in shapes.values())
    # disable=None: a bar on a terminal only; a log file gets no carriage-return frames (ensure_model said where)
    with tqdm(total=total, unit="param", unit_scale=True, desc="demo weights", disable=None if progress else True) \
            as bar:
        for rel, shapes in tables.items():
            tensors = build_file(rel, shapes, seed, dims, bar.update)
            atomic_write(asset.parent / rel, functools.partial(save_file, tensors, metadata={"format": "pt"}))
            del tensors
    marker = {"kind": DEMO_KIND, "seed": seed, "tiny": tiny, "note": "random weights in the official format: "
              "noise-like audio; loads by path without a checksum"}
    atomic_write(asset / DEMO_MARKER, lambda p: p.write_text(json.dumps(marker, indent=1), encoding="utf-8"))
    return AssetPaths.from_root(asset.parent)

