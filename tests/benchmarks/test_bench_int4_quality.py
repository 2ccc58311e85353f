"""benchmarks/bench_int4_quality.py: the Q4_0 / Q8_0 emulation follows the formats' definitions, and a run on tiny
weights scores every scheme against float32."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks import bench_int4_quality

REPO = Path(__file__).resolve().parents[2]


def test_q4_0_maps_the_signed_extreme_to_minus_8_and_clamps_the_other_side_to_7() -> None:
    block = torch.zeros(32)
    block[:4] = torch.tensor([1.0, -0.99, 0.9375, -0.25])  # extreme +1: d = -1/8, w / d = -8, 7.92, -7.5, 2
    weight = torch.stack([block, -block, torch.zeros(32)])  # [3, 32]
    back = bench_int4_quality.q4_0_weight(weight)
    d = -0.125
    assert back[0, :4].tolist() == [-8 * d, 7 * d, -7 * d, 2 * d]  # 7.92 clamps to 7; the tie -7.5 rounds up
    assert back[1, :4].tolist() == [-8 * -d, 7 * -d, -7 * -d, 2 * -d]  # extreme -1: d = +1/8, the same codes
    assert back[:, 4:].eq(0).all() and back[2].eq(0).all()


def test_q8_0_rounds_half_away_from_zero_with_an_fp16_scale() -> None:
    x = torch.zeros(1, 32)
    x[0, :4] = torch.tensor([127.0, -0.5, 0.5, 2.5])  # max 127: d = 1
    back = bench_int4_quality.q8_0_rows(x)
    assert back[0, :4].tolist() == [127.0, -1.0, 1.0, 3.0] and back[0, 4:].eq(0).all()


@pytest.mark.slow
def test_a_tiny_run_scores_every_scheme(tiny_assets, tmp_path: Path) -> None:
    out = tmp_path / "int4_quality.json"
    report = bench_int4_quality.main(["--model", str(tiny_assets), "--seqs", "2", "--steps", "6", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    schemes = report["schemes"]
    assert set(schemes) == {"float32", "emulated_q4_0", "emulated_int4", "emulated_int4_absmax7", "engine_int8",
                            "engine_int4"}
    assert schemes["float32"] == {"top1": 1.0, "top5": 1.0, "cosine": pytest.approx(1.0)}
    for name, row in schemes.items():
        assert 0 < row["top1"] <= row["top5"] <= 1 and 0 < row["cosine"] <= 1 + 1e-6, name
    assert schemes["emulated_int4"]["weight_rel_rmse"] < schemes["emulated_q4_0"]["weight_rel_rmse"]
