"""Parity: audio.vocos.Vocos equals the `vocos==0.1.0` package (as ChatTTS builds it) on the same weights."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from chattts_velocity.audio.vocos import Vocos

from .refclient import RefClient

pytestmark = pytest.mark.parity

TOLERANCE = 1e-4  # max abs error on the waveform (spec: our Vocos must match within 1e-4)
N_FFT, N_MELS = 1024, 100


def random_vocos_state(dim: int, inter: int, layers: int, seed: int) -> dict[str, torch.Tensor]:
    """Official Vocos keys with random, well-scaled values: log-magnitudes stay far below the clip."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        return torch.randn(shape, generator=gen) * scale + shift

    state = {
        "feature_extractor.mel_spec.spectrogram.window": torch.hann_window(N_FFT),
        "feature_extractor.mel_spec.mel_scale.fb": torch.rand((N_FFT // 2 + 1, N_MELS), generator=gen),
        "backbone.embed.weight": randn(dim, N_MELS, 7, scale=1 / math.sqrt(7 * N_MELS)),
        "backbone.embed.bias": randn(dim, scale=0.02),
        "backbone.norm.weight": randn(dim, scale=0.05, shift=1.0), "backbone.norm.bias": randn(dim, scale=0.02),
        "backbone.final_layer_norm.weight": randn(dim, scale=0.05, shift=1.0),
        "backbone.final_layer_norm.bias": randn(dim, scale=0.02),
        "head.out.weight": torch.cat([randn(N_FFT // 2 + 1, dim, scale=0.5 / math.sqrt(dim)),
                                      randn(N_FFT // 2 + 1, dim, scale=math.pi / math.sqrt(dim))]),
        "head.out.bias": randn(N_FFT + 2, scale=0.02),
        "head.istft.window": torch.hann_window(N_FFT),
    }
    for k in range(layers):
        p = f"backbone.convnext.{k}."
        state |= {p + "gamma": randn(dim, scale=0.1, shift=0.3), p + "dwconv.weight": randn(dim, 1, 7, scale=0.4),
                  p + "dwconv.bias": randn(dim, scale=0.02), p + "norm.weight": randn(dim, scale=0.05, shift=1.0),
                  p + "norm.bias": randn(dim, scale=0.02), p + "pwconv1.weight": randn(inter, dim, scale=dim ** -0.5),
                  p + "pwconv1.bias": randn(inter, scale=0.02),
                  p + "pwconv2.weight": randn(dim, inter, scale=inter ** -0.5),
                  p + "pwconv2.bias": randn(dim, scale=0.02)}
    return state


def random_mel(batch: int, frames: int, seed: int) -> np.ndarray:  # [B, 100, T], log-mel-like values
    return (np.random.default_rng(seed).standard_normal((batch, N_MELS, frames)) - 2.0).astype(np.float32)


def assert_wav_close(ours: torch.Tensor, reference: np.ndarray, what: str) -> None:
    assert tuple(ours.shape) == reference.shape, f"{what}: shape {tuple(ours.shape)} != {reference.shape}"
    error = float(np.abs(ours.numpy() - reference).max())
    print(f"{what}: max abs error {error:.3e} (wav peak {np.abs(reference).max():.3f})")
    assert error <= TOLERANCE, f"{what}: max abs error {error:.3e} > {TOLERANCE}"


DIMS = {"tiny": (32, 64, 2), "full": (512, 1536, 8)}  # (dim, intermediate_dim, num_layers)
MELS = {"single": random_mel(1, 2, seed=1), "batch": random_mel(3, 40, seed=2)}


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("vocos")
    for size, dims in DIMS.items():
        save_file(random_vocos_state(*dims, seed=sum(dims)), str(folder / f"{size}.safetensors"))
    return {size: folder / f"{size}.safetensors" for size in DIMS}


@pytest.fixture(scope="module")
def reference(ref_client: RefClient, weights: dict[str, Path], tiny_assets: Path) -> dict[str, dict]:
    """Every reference decode in one runner call: interpreter start-up dominates its cost."""
    tasks = [{"name": f"{size}-{name}", "kind": "vocos_decode", "mel": mel, "vocos_path": str(path)}
             for size, path in weights.items() for name, mel in MELS.items()]
    tasks.append({"name": "chat", "kind": "vocos_decode", "mel": MELS["batch"]})  # the Chat's own Vocos
    return ref_client.run(tasks, asset_root=tiny_assets, size="tiny")


@pytest.mark.parametrize("size", DIMS)
@pytest.mark.parametrize("mel", MELS)
def test_random_weights_match_vocos_package(reference: dict, weights: dict[str, Path], size: str, mel: str) -> None:
    vocos = Vocos.from_state_dict(load_file(str(weights[size])))
    assert_wav_close(vocos.decode(torch.from_numpy(MELS[mel])), reference[f"{size}-{mel}"]["wav"], f"{size}/{mel}")


def test_demo_assets_match_reference_chat_vocos(reference: dict, tiny_assets: Path) -> None:
    """The reference Chat's own Vocos (built by Chat._load from the tiny demo checkpoint) vs ours on that file."""
    vocos = Vocos.from_state_dict(load_file(str(tiny_assets / "asset" / "Vocos.safetensors")))
    assert_wav_close(vocos.decode(torch.from_numpy(MELS["batch"])), reference["chat"]["wav"], "demo tiny asset")
