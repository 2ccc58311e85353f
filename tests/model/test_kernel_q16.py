"""linear_int8 on AVX-512 VNNI and AVX2: int8 tiles times x's Q16 rows (isa_<isa>_q16.h), bit for bit the formula of
q8_rows.h computed here in torch: per row scale = max |x| / 32767, q = x * (32767 / max |x|) rounded half to even,
exact integer sums, y = bf16(row scale * (x's scale * float(sum)))."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity.model import PackedLinear, kernels

gen = torch.Generator().manual_seed(3)


def q16_reference(x: torch.Tensor, q: torch.Tensor, row_scales: torch.Tensor) -> torch.Tensor:
    values = x.bfloat16().float()
    largest = values.abs().amax(dim=1, keepdim=True)
    inverse = torch.where(largest > 0, torch.tensor(32767.0) / largest, torch.zeros_like(largest))
    xq = torch.round(values * inverse).to(torch.int64)
    sums = (xq @ q.to(torch.int64).T).float()
    return (row_scales[None, :] * ((largest / 32767.0) * sums)).bfloat16()


Q16_ISAS = ("avx512", "avx2")  # the ISAs whose linear_int8 multiplies Q16 rows (CV_INT8_Q16)


@pytest.mark.parametrize("rows", [1, 3, 4, 9, 64])
def test_int8_tiles_times_q16_rows_match_the_formula_bit_for_bit(isa: str, rows: int) -> None:
    if isa not in Q16_ISAS:
        pytest.skip(f"{isa}: int8 tiles times bf16 activations")
    weight = torch.randn(40, 3072, generator=gen) * 0.05
    lin = PackedLinear(weight, "int8")
    q = (lin.dequantized() / lin.scales[:, None]).round().to(torch.int8)
    x = torch.randn(rows, 3072, generator=gen) * torch.logspace(-3, 1, 3072)  # widely spread magnitudes
    x[0, :100] = 0.0
    got = kernels.ops().linear_int8(x.bfloat16(), kernels.to_tiles(q, 16), lin.scales)
    assert torch.equal(got, q16_reference(x, q, lin.scales))
    zero = kernels.ops().linear_int8(torch.zeros(2, 3072, dtype=torch.bfloat16), kernels.to_tiles(q, 16), lin.scales)
    assert not zero.any()


def test_int8_tiles_refuse_more_inputs_than_int32_sums_hold(isa: str) -> None:
    if isa not in Q16_ISAS:
        pytest.skip(f"{isa}: int8 tiles times bf16 activations")
    q = torch.ones(4, 8224, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="input features here"):
        kernels.ops().linear_int8(torch.ones(1, 8224, dtype=torch.bfloat16), kernels.to_tiles(q, 16), torch.ones(4))
