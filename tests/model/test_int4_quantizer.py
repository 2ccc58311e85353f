"""The int4 weights' quantiser (kernels.quantize_int4): range, exact grids, zero groups, and its squared error
against llama.cpp's Q4_0 rule on the same groups."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity.model import kernels

gen = torch.Generator().manual_seed(0)


def _dequantised(weight: torch.Tensor) -> torch.Tensor:
    q, scales = kernels.quantize_int4(weight)
    return q.float() * scales.repeat_interleave(kernels.INT4_GROUP, dim=1)


def _q4_0_rule(weight: torch.Tensor) -> torch.Tensor:
    """Q4_0's scale (the group's signed extreme maps to -8), fp32, round half to even: the candidate c = -8."""
    groups = weight.reshape(weight.shape[0], -1, kernels.INT4_GROUP)
    extreme = groups.gather(-1, groups.abs().argmax(-1, keepdim=True))
    scale = extreme / -8
    return (torch.round(groups / scale).clamp(-8, 7) * scale).reshape(weight.shape)


def test_values_span_minus_8_to_7_with_one_fp32_scale_per_group() -> None:
    weight = torch.randn(64, 96, generator=gen) * 0.05
    q, scales = kernels.quantize_int4(weight)
    assert q.dtype == torch.int8 and q.shape == (64, 96) and scales.dtype == torch.float32 and scales.shape == (64, 3)
    assert q.min().item() == -8 and q.max().item() == 7


@pytest.mark.parametrize("distribution", ["normal", "uniform", "heavy-tailed"])
def test_each_groups_squared_error_is_at_most_q4_0s(distribution: str) -> None:
    weight = {"normal": torch.randn(256, 128, generator=gen),
              "uniform": torch.rand(256, 128, generator=gen) - 0.5,
              "heavy-tailed": torch.randn(256, 128, generator=gen) ** 3}[distribution]
    ours = (_dequantised(weight) - weight).square().reshape(256, -1, kernels.INT4_GROUP).sum(-1)
    q4_0 = (_q4_0_rule(weight) - weight).square().reshape(256, -1, kernels.INT4_GROUP).sum(-1)
    assert (ours <= q4_0 * (1 + 1e-5) + 1e-12).all()
    assert ours.sum() < 0.95 * q4_0.sum()  # and lower overall: the fit moves many groups off Q4_0's scale


def test_a_group_on_a_16_level_grid_is_exact_and_a_zero_group_is_zero() -> None:
    grid = (torch.arange(-8, 8).float() * 0.125).repeat(2)  # 32 values, each a multiple of 0.125 in [-1, 0.875]
    weight = torch.stack([grid, -grid.flip(0), torch.zeros(32), 3 * grid]).repeat(1, 2)  # [4, 64]
    q, scales = kernels.quantize_int4(weight)
    assert torch.equal(_dequantised(weight), weight)
    assert scales[2].eq(0).all() and q[2].eq(0).all()


def test_in_features_not_a_multiple_of_32_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="in_features"):
        kernels.quantize_int4(torch.randn(4, 48))
