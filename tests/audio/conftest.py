"""Fixtures: tiny random DVAE / Decoder / Vocos state dicts (audio_state_dicts.py)."""
from __future__ import annotations

import pytest
import torch
from audio_state_dicts import decoder_shapes, dvae_shapes, random_state_dict, vocos_shapes


@pytest.fixture
def dvae_sd() -> dict[str, torch.Tensor]:
    return random_state_dict(dvae_shapes(dim=32, hidden=32, bn=16, n_layer=2), seed=1)


@pytest.fixture
def decoder_sd() -> dict[str, torch.Tensor]:
    return random_state_dict(decoder_shapes(idim=32, hidden=32, bn=16, n_layer=2), seed=2)


@pytest.fixture
def vocos_sd() -> dict[str, torch.Tensor]:
    return random_state_dict(vocos_shapes(dim=32, inter=64, n_layer=2), seed=3)
