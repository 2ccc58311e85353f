"""Split-K of the fused GEMMs (model/kernels/triton/split_k.py): the split depends on the weight alone, the partials
add up to the unsplit product, a row's bits are the same alone and in a batch, and a launch of more rows than the
workspace holds equals one launch of them all. On CUDA, or in Triton's CPU interpreter."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity.model.kernels.triton import available

if available() is not None:
    pytest.skip(f"Triton kernels unavailable: {available()}", allow_module_level=True)

from chattts_velocity.model.kernels.triton import gemm, qkv, split_k

pytestmark = pytest.mark.triton
TILE_ARGS = {"block_m": 16, "block_n": 32, "block_k": 32}
ROWS = 37  # three row tiles, the last one partial


def _gemms(device: str, splits: int | None, workspace=None, rows: slice = slice(None), tile: gemm.Tile | None = None,
           dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    tile = tile or gemm.Tile(**TILE_ARGS)
    x, w, res = torch.randn(ROWS, 128), torch.randn(96, 128) * 0.1, torch.randn(ROWS, 96)
    gate_up, norm = torch.randn(128, 128) * 0.1, torch.rand(128) + 0.5
    weights, positions = torch.randn(3 * 64, 128) * 0.1, torch.arange(ROWS)
    pools = torch.zeros(2, 16, 4, 1, 32), torch.zeros(2, 16, 4, 1, 32)
    cos, sin = torch.rand(64, 32), torch.rand(64, 32)
    x, w, res, gate_up, norm, weights, positions, cos, sin = (
        t.to(device) for t in (x, w, res, gate_up, norm, weights, positions, cos, sin))
    x, w, res, gate_up, norm, weights = (t.to(dtype) for t in (x, w, res, gate_up, norm, weights))
    pools = pools[0].to(device, dtype), pools[1].to(device, dtype)
    x, res, positions = x[rows], res[rows], positions[rows]
    return {"residual_linear": gemm.residual_linear(x, w, res, tile=tile, splits=splits, workspace=workspace),
            "stats": _with_stats(x, res, norm, gate_up, tile, splits, workspace),
            "linear": gemm.linear(x, w, tile=tile, splits=splits, workspace=workspace),
            "norm_gate_up": gemm.norm_gate_up(x, norm, gate_up, 1e-6, tile=tile, splits=splits, workspace=workspace),
            "norm_qkv_rope": qkv.norm_qkv_rope(x, norm, weights, positions, positions, cos, sin, pools[0][0],
                                               pools[1][0], 1e-6, tile=tile, splits=splits, workspace=workspace)}


def _with_stats(x, res, norm, gate_up, tile, splits, workspace) -> torch.Tensor:
    # norm_gate_up on a residual that residual_linear wrote, its statistics carried in `stats`
    w = gate_up.flip(0).contiguous()  # [128, 128]: a residual 128 wide
    residual = torch.cat([res, res[:, :32]], 1)
    stats = gemm.stats_buffer(x.shape[0], w, tile)
    out = gemm.residual_linear(x, w, residual, tile=tile, splits=splits, workspace=workspace, stats=stats)
    return gemm.norm_gate_up(out, norm, gate_up, 1e-6, tile=tile, splits=splits, workspace=workspace, stats=stats)


def test_the_split_depends_on_the_weight_alone_and_fills_the_target() -> None:
    # ChatTTS's decode GEMMs with the bf16 tile (32 columns, K chunks of 64)
    _, block_n, block_k = gemm.HALF_TILE.blocks
    shapes = {"qkv": (1152, 768), "o": (768, 768), "gate_up": (3072, 768), "down": (768, 3072)}
    chosen = {name: split_k.plan(columns, k, block_n, block_k).splits for name, (columns, k) in shapes.items()}
    assert chosen == {"qkv": 4, "o": 4, "gate_up": 2, "down": 8}
    for name, (columns, k) in shapes.items():
        assert (columns // block_n) * chosen[name] <= split_k.TARGET_PROGRAMS
        assert (k // block_k) % chosen[name] == 0 and (k // block_k) // chosen[name] >= split_k.MIN_CHUNKS
    assert split_k.plan(21178, 768, 16, 32).splits == 1  # the text head has tiles enough


@pytest.mark.parametrize("splits", [2, 4])
def test_split_products_equal_the_unsplit_ones_and_leave_the_counters_at_zero(splits: int, triton_device) -> None:
    workspace = split_k.SplitWorkspace.allocate(64, 4 * 192, 8, 16, torch.device(triton_device))
    whole, split = _gemms(triton_device, 1), _gemms(triton_device, splits, workspace)
    for name, expected in whole.items():
        torch.testing.assert_close(split[name], expected, rtol=1e-5, atol=1e-5, msg=name)
    assert int(workspace.counters.abs().sum()) == 0


def test_a_row_is_the_same_alone_as_in_a_split_batch(triton_device) -> None:
    batch = _gemms(triton_device, 4)
    for row in (0, 20, 36):
        alone = _gemms(triton_device, 4, rows=slice(row, row + 1))
        for name, out in batch.items():
            assert torch.equal(alone[name], out[row: row + 1]), (name, row)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_row_is_the_same_alone_as_in_a_batch_of_37_with_the_tensor_core_tile(dtype, triton_device) -> None:
    # the bf16/fp16 tile a GPU runs (64 rows, the 37 rows masked into one tile), with the split the weights choose
    tile = gemm.HALF_TILE
    batch = _gemms(triton_device, None, tile=tile, dtype=dtype)
    for row in (0, 36):
        alone = _gemms(triton_device, None, rows=slice(row, row + 1), tile=tile, dtype=dtype)
        for name, out in batch.items():
            assert torch.equal(alone[name], out[row: row + 1]), (name, row)


def test_carried_statistics_equal_the_ones_summed_from_x(triton_device) -> None:
    # residual_linear's per-tile sums of squares add up to the row's, and the norm reading them gives the norm of x
    torch.manual_seed(1)
    tile = gemm.Tile(**TILE_ARGS)
    x, w, residual = torch.randn(ROWS, 128), torch.randn(128, 128) * 0.1, torch.randn(ROWS, 128)
    norm, gate_up = torch.rand(128) + 0.5, torch.randn(64, 128) * 0.1
    x, w, residual, norm, gate_up = (t.to(triton_device) for t in (x, w, residual, norm, gate_up))
    stats = gemm.stats_buffer(ROWS, w, tile)
    out = gemm.residual_linear(x, w, residual, tile=tile, stats=stats)
    assert stats.shape == (ROWS, 128 // tile.block_n)
    torch.testing.assert_close(stats.sum(1), out.square().sum(1), rtol=1e-5, atol=1e-5)
    carried = gemm.norm_gate_up(out, norm, gate_up, 1e-6, tile=tile, stats=stats)
    torch.testing.assert_close(carried, gemm.norm_gate_up(out, norm, gate_up, 1e-6, tile=tile), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="stats"):
        gemm.residual_linear(x, w, residual, tile=tile, stats=stats[:, :2].contiguous())


def test_more_rows_than_the_workspace_holds_run_as_slices_with_the_same_bits(triton_device) -> None:
    small = split_k.SplitWorkspace.allocate(16, 4 * 192, 8, 16, torch.device(triton_device))
    assert split_k.row_slices(ROWS, small) == [(0, 16), (16, 32), (32, 37)]
    sliced, whole = _gemms(triton_device, 4, small), _gemms(triton_device, 4)
    for name, out in whole.items():
        assert torch.equal(sliced[name], out), name


def test_a_split_that_does_not_divide_the_k_chunks_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="splits"):
        split_k.plan(96, 128, 32, 32, splits=3)


def test_an_unsplit_gemm_is_one_launch_whatever_the_workspace_holds() -> None:
    # one K range reads no partials: no row slices and no scratch of the GEMM's width (the text head's 21,178
    # columns would not fit the layers' workspace)
    small = split_k.SplitWorkspace.allocate(16, 8, 1, 16, torch.device("cpu"))
    launches: list[tuple[tuple[int, int, int], slice, int]] = []
    split_k.launch_split(ROWS, 21178, 21178, 768, (16, 16, 64), small, None, torch.device("cpu"),
                         lambda grid, rows, partials, counters, split: launches.append((grid, rows, partials.numel())))
    assert launches == [((3, 1324, 1), slice(0, ROWS), small.partials.numel())]
    split_k.launch_split(ROWS, 768, 768, 3072, (16, 16, 64), small, None, torch.device("cpu"),
                         lambda grid, rows, partials, counters, split: launches.append((grid, rows, split.splits)))
    assert [entry[:2] for entry in launches[1:]] == [((1, 48, 4), slice(0, 16)), ((1, 48, 4), slice(16, 32)),
                                                    ((1, 48, 4), slice(32, ROWS))]
