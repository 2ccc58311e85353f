"""GFSQ: decode equals upstream's FSQ formula, encode follows the per-version algorithm, grid round trips."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from chattts_velocity.audio.gfsq import GFSQ, FSQVariant


def make_gfsq(variant: FSQVariant = FSQVariant.VQP_1_18_5, group_dim: int = 32, seed: int = 0) -> GFSQ:
    torch.manual_seed(seed)
    gfsq = GFSQ(2 * group_dim, variant=variant)
    with torch.no_grad():
        for p in gfsq.parameters():
            p.normal_()
    return gfsq


def formula_levels(index: int) -> list[int]:
    """index = l0 + 5*l1 + 25*l2 + 125*l3."""
    return [(index // 5**d) % 5 for d in range(4)]


def formula_decode(gfsq: GFSQ, codes: torch.Tensor, scales: tuple[float, float]) -> torch.Tensor:
    """[B, 4, T] -> [B, dim, T], element by element from the spec (channel c = g*2 + r)."""
    b, _, t = codes.shape
    groups = []
    for g, rvq in enumerate(gfsq.quantizer.rvqs):
        z = torch.zeros(b, t, 4)
        for bi in range(b):
            for ti in range(t):
                for r in range(2):
                    lv = formula_levels(int(codes[bi, g * 2 + r, ti]))
                    z[bi, ti] += torch.tensor([(v - 2) / 2 for v in lv]) * scales[r]
        groups.append(F.linear(z, rvq.project_out.weight, rvq.project_out.bias))
    return torch.cat(groups, -1).transpose(1, 2)


def test_decode_hand_picked_indices_equal_formula() -> None:
    gfsq = make_gfsq()
    picks = [0, 624, 312, 1 + 5 * 2 + 25 * 3 + 125 * 4, 7, 600]
    codes = torch.tensor([[picks[:3], picks[3:], picks[1:4], picks[2:5]]])  # [1, 4, 3]
    torch.testing.assert_close(gfsq.decode(codes), formula_decode(gfsq, codes, (1.0, 0.25)))


def test_decode_scales_of_vqp_1_26_are_one_and_a_fifth() -> None:
    gfsq = make_gfsq(FSQVariant.VQP_1_26)
    codes = torch.randint(0, 625, (2, 4, 3), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(gfsq.decode(codes), formula_decode(gfsq, codes, (1.0, 0.2)))


def test_state_dict_holds_only_the_projections() -> None:
    keys = set(make_gfsq().state_dict())
    expected = {f"quantizer.rvqs.{g}.project_{io}.{w}" for g in range(2) for io in ("in", "out")
                for w in ("weight", "bias")}
    assert keys == expected


def grid_inputs(gfsq: GFSQ, v0: torch.Tensor, v1: torch.Tensor) -> torch.Tensor:
    """x [1, dim, T] whose projection z of group g equals v0[g] + v1[g]/4 (project_in = identity on 4 channels)."""
    group_dim = gfsq.quantizer.rvqs[0].project_in.in_features
    with torch.no_grad():
        for rvq in gfsq.quantizer.rvqs:
            rvq.project_in.weight.zero_()
            rvq.project_in.weight[:, :4] = torch.eye(4)
            rvq.project_in.bias.zero_()
    t = v0.shape[1]
    x = torch.randn(1, 2, group_dim, t)  # channels beyond the first 4 of each group are ignored
    x[0, :, :4, :] = (v0 + v1 / 4).permute(0, 2, 1)
    return x.reshape(1, 2 * group_dim, t)


def test_encode_decode_round_trip_on_grid_values() -> None:
    gfsq = make_gfsq()
    g = torch.Generator().manual_seed(1)
    grid = torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0])
    v0 = grid[torch.randint(0, 5, (2, 40, 4), generator=g)]  # [G, T, 4] stage-0 code values
    v1 = grid[1:4][torch.randint(0, 3, (2, 40, 4), generator=g)]  # stage 1 in {-0.5, 0, 0.5}
    v1[v0.abs() == 1] = 0.0  # tanh(0.875) * 2.002 rounds to 1, so +-1 -+ 1/8 is not recoverable
    codes = gfsq.encode(grid_inputs(gfsq, v0, v1))  # [1, 4, T]
    assert codes.dtype == torch.int32
    for grp in range(2):
        for r, v in enumerate((v0, v1)):
            lv = (v[grp] * 2 + 2).long()  # [T, 4]
            expected = lv[:, 0] + 5 * lv[:, 1] + 25 * lv[:, 2] + 125 * lv[:, 3]
            assert torch.equal(codes[0, grp * 2 + r].long(), expected)
    expected_out = torch.cat(
        [F.linear(v0[grp] + v1[grp] / 4, rvq.project_out.weight, rvq.project_out.bias)
         for grp, rvq in enumerate(gfsq.quantizer.rvqs)], -1)
    torch.testing.assert_close(gfsq.decode(codes)[0].T, expected_out)


def spec_encode(z: torch.Tensor, variant: FSQVariant) -> torch.Tensor:
    """Upstream's encode table for one group, z = project_in(x): [N, 4] -> levels [N, R=2, 4]."""
    if variant is FSQVariant.VQP_1_26:
        res, scales = torch.tanh(z / 1.25) * 1.25, (1.0, 0.2)
    else:
        res = torch.tanh(z) * 2.002 if variant is FSQVariant.VQP_1_12 else z.clone()
        scales = (1.0, 0.25)
    out = []
    for s in scales:
        u = res / s
        if variant is FSQVariant.VQP_1_26:
            lv = torch.floor(2 * (u.clamp(-1, 1) + 1) + 0.5)
            q = lv / 2 - 1
        else:
            q = torch.round(torch.tanh(u) * 2.002) / 2
            lv = 2 * q + 2
        res = res - q * s
        out.append(lv)
    return torch.stack(out, 1)


@pytest.mark.parametrize("variant", list(FSQVariant))
def test_encode_follows_the_spec_table(variant: FSQVariant) -> None:
    gfsq = make_gfsq(variant, seed=3)
    x = torch.randn(1, 64, 50) * 0.3
    codes = gfsq.encode(x)[0]  # [4, T]
    basis = torch.tensor([1, 5, 25, 125])
    for g, rvq in enumerate(gfsq.quantizer.rvqs):
        z = F.linear(x[0, g * 32:(g + 1) * 32].T, rvq.project_in.weight, rvq.project_in.bias)
        lv = spec_encode(z, variant)  # [T, 2, 4]
        expected = (lv.long() * basis).sum(-1)  # [T, 2]
        assert torch.equal(codes[g * 2:(g + 1) * 2].T.long(), expected)
    assert len(set(codes.flatten().tolist())) > 10  # the inputs exercise many codebook entries


def test_bad_codes_raise_value_error() -> None:
    gfsq = make_gfsq()
    with pytest.raises(ValueError, match="625"):
        gfsq.decode(torch.full((1, 4, 2), 625))
    with pytest.raises(ValueError, match=r"\[B, 4, T\]"):
        gfsq.decode(torch.zeros(1, 3, 2, dtype=torch.long))
