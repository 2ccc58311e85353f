"""Tiny random state dicts in the official DVAE / Decoder / Vocos formats: their shapes and values (a module of its
own name, so that test files import it whichever test folders are collected)."""
from __future__ import annotations

import math

import numpy as np
import torch

Shapes = dict[str, tuple[int, ...]]


def stack_shapes(p: str, idim: int, odim: int, bn: int, hidden: int, n_layer: int) -> Shapes:
    out: Shapes = {
        f"{p}conv_in.0.weight": (bn, idim, 3), f"{p}conv_in.0.bias": (bn,),
        f"{p}conv_in.2.weight": (hidden, bn, 3), f"{p}conv_in.2.bias": (hidden,),
        f"{p}conv_out.weight": (odim, hidden, 1),
    }
    for j in range(n_layer):
        out |= block_shapes(f"{p}decoder_block.{j}.", hidden, 4 * hidden, 7, "weight")
    return out


def block_shapes(p: str, dim: int, inter: int, kernel: int, scale: str) -> Shapes:
    return {
        f"{p}{scale}": (dim,), f"{p}dwconv.weight": (dim, 1, kernel), f"{p}dwconv.bias": (dim,),
        f"{p}norm.weight": (dim,), f"{p}norm.bias": (dim,),
        f"{p}pwconv1.weight": (inter, dim), f"{p}pwconv1.bias": (inter,),
        f"{p}pwconv2.weight": (dim, inter), f"{p}pwconv2.bias": (dim,),
    }


def mel_shapes(p: str, n_fft: int = 1024, n_mels: int = 100) -> Shapes:
    return {f"{p}mel_spec.spectrogram.window": (n_fft,), f"{p}mel_spec.mel_scale.fb": (n_fft // 2 + 1, n_mels)}


def dvae_shapes(dim: int, hidden: int, bn: int, n_layer: int, n_mels: int = 100) -> Shapes:
    out: Shapes = {"coef": (1, n_mels, 1), "downsample_conv.0.weight": (dim, n_mels, 3),
                   "downsample_conv.0.bias": (dim,), "downsample_conv.2.weight": (dim, dim, 4),
                   "downsample_conv.2.bias": (dim,), "out_conv.weight": (n_mels, dim, 3)}
    out |= mel_shapes("preprocessor_mel.")
    out |= stack_shapes("encoder.", dim, 2 * dim, bn, hidden, n_layer)
    out |= stack_shapes("decoder.", dim, dim, bn, hidden, n_layer)
    for g in range(2):
        p = f"vq_layer.quantizer.rvqs.{g}."
        out |= {p + "project_in.weight": (4, dim), p + "project_in.bias": (4,),
                p + "project_out.weight": (dim, 4), p + "project_out.bias": (dim,)}
    return out


def decoder_shapes(idim: int, hidden: int, bn: int, n_layer: int, n_mels: int = 100) -> Shapes:
    return {"coef": (1, n_mels, 1), "out_conv.weight": (n_mels, idim, 3)} | stack_shapes(
        "decoder.", idim, idim, bn, hidden, n_layer)


def vocos_shapes(dim: int, inter: int, n_layer: int, n_mels: int = 100, n_fft: int = 1024) -> Shapes:
    out = mel_shapes("feature_extractor.", n_fft, n_mels)
    out |= {"backbone.embed.weight": (dim, n_mels, 7), "backbone.embed.bias": (dim,),
            "backbone.norm.weight": (dim,), "backbone.norm.bias": (dim,),
            "backbone.final_layer_norm.weight": (dim,), "backbone.final_layer_norm.bias": (dim,),
            "head.out.weight": (n_fft + 2, dim), "head.out.bias": (n_fft + 2,), "head.istft.window": (n_fft,)}
    for k in range(n_layer):
        out |= block_shapes(f"backbone.convnext.{k}.", dim, inter, 7, "gamma")
    return out


def numpy_htk_filterbank(n_freqs: int, n_mels: int, sample_rate: int, f_min: float = 0.0,
                         f_max: float | None = None) -> np.ndarray:
    """HTK triangular filters written directly from the formula, in float64: [n_freqs, n_mels]."""
    f_max = sample_rate / 2 if f_max is None else f_max
    mels = np.linspace(2595.0 * np.log10(1.0 + f_min / 700.0), 2595.0 * np.log10(1.0 + f_max / 700.0), n_mels + 2)
    edges = 700.0 * (10.0 ** (mels / 2595.0) - 1.0)  # HTK mel -> Hz
    freqs = np.linspace(0.0, sample_rate // 2, n_freqs)[:, None]  # [n_freqs, 1]
    lo, mid, hi = edges[None, :-2], edges[None, 1:-1], edges[None, 2:]  # [1, n_mels] each
    rising = np.where((freqs >= lo) & (freqs <= mid), (freqs - lo) / (mid - lo), 0.0)
    falling = np.where((freqs > mid) & (freqs <= hi), (hi - freqs) / (hi - mid), 0.0)
    fb = rising + falling
    return fb


def random_state_dict(shapes: Shapes, seed: int) -> dict[str, torch.Tensor]:
    """Fan-in scaled weights; real Hann windows and HTK filterbanks."""
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}
    for key, shape in shapes.items():
        if key.endswith("window"):
            n = shape[0]
            sd[key] = (0.5 - 0.5 * torch.cos(2 * math.pi * torch.arange(n, dtype=torch.float64) / n)).float()
        elif key.endswith(".fb"):
            sd[key] = torch.from_numpy(numpy_htk_filterbank(shape[0], shape[1], 24000)).float()
        elif key == "coef":
            sd[key] = 0.5 + torch.rand(shape, generator=g)
        elif key.endswith(("norm.weight", ".gamma")) or (len(shape) == 1 and key.endswith(".weight")):
            sd[key] = 0.5 + torch.rand(shape, generator=g)  # LayerNorm gains and layer scales
        elif len(shape) == 1:
            sd[key] = 0.1 * torch.randn(shape, generator=g)
        else:
            fan_in = math.prod(shape[1:])
            sd[key] = torch.randn(shape, generator=g) / math.sqrt(fan_in)
    return sd
