"""CPU linear and attention kernels (model/kernels/) against float64 formulas, their batch invariance and the
fallback to torch's kernels; every kernel test runs on each ISA this CPU can run (the `isa` fixture)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from chattts_velocity.model import DecodeMetadata, PackedLinear, kernels
from chattts_velocity.model.attention import dequantize_kv, paged_decode_attention, quantize_kv

UNSUPPORTED = kernels.unsupported()
needs_kernels = pytest.mark.skipif(UNSUPPORTED is not None, reason=f"CPU kernels unsupported here: {UNSUPPORTED}")
gen = torch.Generator().manual_seed(0)
WEIGHT = torch.randn(200, 96, generator=gen) * 0.05  # N % 4 == 0, K % 32 == 0, not powers of two
WIDE = torch.randn(80, 96, generator=gen) * 0.05  # N % 16 == 0: fits the AMX panels too


def _bf16_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # x, w and the output rounded to bf16 (relative 2^-8 each), products exact, fp32 sums
    return 3 * 2**-8 * (x.double().abs() @ w.double().abs().T) + 1e-6


LAYOUTS = ["tiles", "panels"]  # panels: the AMX kernel, only where the CPU has AMX


def _layout(weight: torch.Tensor, layout: str, chunk: int) -> torch.Tensor:
    if layout == "panels" and not kernels.amx_ready():
        pytest.skip("no AMX-BF16 here: the panels (AMX) kernel cannot run")
    return kernels.to_panels(weight) if layout == "panels" else kernels.to_tiles(weight, chunk)


@needs_kernels
def test_kernels_build_and_the_layout_follows_the_cpu(isa: str) -> None:
    assert kernels.load()
    expected = "amx" if kernels.amx_ready() else "tiles"
    assert f"kernel={expected}" in repr(PackedLinear(WIDE, "bfloat16"))
    assert PackedLinear(WEIGHT, "int8").kernel == "tiles"  # 200 outputs: not a multiple of 16, no panels


@needs_kernels
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", ["bfloat16", "int8", "int8_q8", "int4"])
def test_linears_within_bf16_rounding_and_batch_invariant(isa: str, mode: str, layout: str) -> None:
    lin = PackedLinear(WIDE, "int8" if mode == "int8_q8" else mode)
    op = kernels.ops()
    integer = mode in ("int4", "int8_q8")  # times x's Q8 rows
    if mode == "int4":
        if layout == "panels":
            pytest.skip("int4 has the tile layout only")
        w = lin.dequantized().double()

        def run(x: torch.Tensor) -> torch.Tensor:
            return op.linear_int4(x.bfloat16(), lin.packed, lin.scales)
    elif mode in ("int8", "int8_q8"):
        if mode == "int8_q8" and layout == "panels":
            pytest.skip("Q8 rows times int8 weights run on the tiles only")
        q = (lin.dequantized() / lin.scales[:, None]).round().to(torch.int8)
        weight, w = _layout(q, layout, 16), lin.dequantized().double()
        linear = op.linear_int8_q8 if mode == "int8_q8" else op.linear_int8

        def run(x: torch.Tensor) -> torch.Tensor:
            return linear(x.bfloat16(), weight, lin.scales)
    else:
        weight, w = _layout(WIDE.bfloat16(), layout, 32), WIDE.double()

        def run(x: torch.Tensor) -> torch.Tensor:
            return op.linear_bf16(x.bfloat16(), weight)
    x = torch.randn(150, 96, generator=gen)
    whole = run(x)  # 150 rows: several 64-row AMX passes and 4-row tile groups, partial ones at the end
    assert whole.dtype == torch.bfloat16 and whole.shape == (150, 80)
    seen = q8_values(x) if integer else x.bfloat16().double()
    assert ((whole.double() - seen @ w.T).abs() <= _bf16_bound(seen.float(), w.float())).all()
    for start, rows in [(0, 1), (7, 1), (3, 2), (10, 3), (20, 4), (30, 5), (60, 13), (40, 17), (0, 64), (50, 65),
                        (149, 1)]:
        assert torch.equal(run(x[start:start + rows]), whole[start:start + rows]), (start, rows)


def q8_values(x: torch.Tensor) -> torch.Tensor:
    """The values of x's Q8 rows (kernels.quantize_q8_rows), what the integer int8 / int4 kernels multiply."""
    q, scales = kernels.quantize_q8_rows(x.bfloat16())
    return (q.double().reshape(len(x), -1, 32) * scales.double()[..., None]).reshape(x.shape)


@needs_kernels
def test_packed_linear_runs_its_layout_at_every_batch_size(isa: str) -> None:
    for mode in ("bfloat16", "int8", "int4"):
        lin = PackedLinear(WIDE, mode)
        x = torch.randn(70, 96, generator=gen)
        whole = lin(x)
        assert whole.dtype == torch.bfloat16
        for rows in (1, 4, 5, 64):
            assert torch.equal(lin(x[:rows]), whole[:rows])


@needs_kernels
def test_int8_activations_switch_chooses_the_q8_kernel_at_packing(isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(5, 96, generator=gen)
    default = PackedLinear(WEIGHT, "int8")
    monkeypatch.setenv(kernels.INT8_SWITCH, "q8")
    q8 = PackedLinear(WEIGHT, "int8")
    assert not default.int8_q8 and q8.int8_q8 and torch.equal(q8.packed, default.packed)
    assert torch.equal(q8(x), kernels.ops().linear_int8_q8(x.bfloat16(), q8.packed, q8.scales))
    assert torch.equal(default(x), kernels.ops().linear_int8(x.bfloat16(), default.packed, default.scales))
    monkeypatch.setenv(kernels.INT8_SWITCH, "int4")
    with pytest.raises(ValueError, match=kernels.INT8_SWITCH):
        PackedLinear(WEIGHT, "int8")


def test_noamx_switch_keeps_the_avx512_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernels.ENV_SWITCH, "noamx")
    assert not kernels.amx_ready()
    if kernels.unsupported() is None:
        assert PackedLinear(WIDE, "bfloat16").kernel == "tiles" and kernels.kernel_path() == "avx512"


def test_to_panels_is_a_pure_reordering() -> None:
    w = torch.arange(32 * 64).reshape(32, 64)
    panels = kernels.to_panels(w)
    assert panels.shape == (2, 32, 16, 2)
    # panel p, pair j, column c, element e = W[16 p + c, 2 j + e]
    assert panels[1, 5, 3, 1].item() == w[19, 11].item() and panels[0, 31, 15, 0].item() == w[15, 62].item()


@needs_kernels
def test_shapes_that_do_not_fit_tiles_use_torch_kernels(isa: str) -> None:
    odd = torch.randn(30, 40, generator=gen) * 0.05  # 30 % 4 != 0, 40 % 32 != 0
    for mode in ("bfloat16", "int8"):
        lin = PackedLinear(odd, mode)
        assert lin.packed is None
        x = torch.randn(3, 40, generator=gen)
        assert (lin(x).double() - x.double() @ odd.double().T).abs().max().item() < 0.02


@needs_kernels
def test_kernel_rejects_mismatched_inputs_clearly(isa: str) -> None:
    with pytest.raises(RuntimeError, match="features"):
        kernels.ops().linear_bf16(torch.randn(2, 64).bfloat16(), kernels.to_tiles(WEIGHT.bfloat16(), 32))


def test_switch_off_keeps_torch_kernels_without_a_warning() -> None:
    code = ("import warnings; warnings.simplefilter('error');"
            "import torch; from chattts_velocity.model import PackedLinear, kernels;"
            "assert not kernels.load();"
            "lin = PackedLinear(torch.randn(8, 32), 'bfloat16'); assert lin.packed is None, lin;"
            "print(lin(torch.randn(2, 32)).shape)")
    env = {**os.environ, kernels.ENV_SWITCH: "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "torch.Size([2, 8])" in done.stdout


def test_a_precision_on_torch_kernels_warns_once_naming_it() -> None:
    code = ("import warnings, torch\nfrom chattts_velocity.model import PackedLinear\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    warnings.simplefilter('always')\n"
            "    [PackedLinear(torch.randn(8, 32), mode) for mode in ('int8', 'int8', 'bfloat16')]\n"
            "print(*[str(w.message) for w in seen], sep='\\n')")
    other = "neon" if kernels.isa() != "neon" else "avx2"  # an ISA this CPU cannot run
    env = {**os.environ, kernels.ENV_SWITCH: other}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2 and "dtype 'int8' runs on torch's generic CPU kernels" in lines[0], lines
    assert "dtype 'bfloat16'" in lines[1] and f"{kernels.ENV_SWITCH}={other}" in lines[1]


def test_to_tiles_is_a_pure_reordering() -> None:
    w = torch.arange(8 * 64).reshape(8, 64)
    tiles = kernels.to_tiles(w, 32)
    assert tiles.shape == (2, 2, 4, 32)
    assert torch.equal(tiles[1, 0, 2], w[6, :32]) and torch.equal(tiles[0, 1, 3], w[3, 32:])
    wide = torch.arange(32 * 64).reshape(32, 64)
    assert torch.equal(kernels.from_tiles(tiles), w) and torch.equal(kernels.from_panels(kernels.to_panels(wide)), wide)


@needs_kernels
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_paged_decode_attention_kernel_matches_the_torch_formula(isa: str, head_dim: int) -> None:
    num_blocks, block_size, heads = 30, 16, 3
    k_cache = torch.randn(num_blocks, block_size, heads, head_dim, generator=gen).bfloat16()
    v_cache = torch.randn(num_blocks, block_size, heads, head_dim, generator=gen).bfloat16()
    q = (torch.randn(6, heads, head_dim, generator=gen) * 2).bfloat16()
    tables = torch.randperm(num_blocks, generator=gen)[:30].view(6, 5)  # distinct blocks, padding rows included
    lens = torch.tensor([1, 16, 17, 80, 45, 2])  # block edges, a full table, a single position
    meta = DecodeMetadata(torch.zeros(6, dtype=torch.long), tables, lens)
    expected = paged_decode_attention(q, k_cache, v_cache, meta).float()
    out = kernels.ops().paged_decode_attention(q, k_cache, v_cache, tables, lens, head_dim**-0.5)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    # same fp32 arithmetic up to summation order and a 2e-7 exp: at most one bf16 rounding step apart
    assert ((out.float() - expected).abs() <= 2**-7 * expected.abs() + 1e-6).all()
    assert torch.equal(out[0].float(), v_cache[tables[0, 0], 0].float())  # one position: its V exactly
    # alone, a sequence's heads are split across threads: every head still sums in the same order
    alone = kernels.ops().paged_decode_attention(q[3:4], k_cache, v_cache, tables[3:4], lens[3:4],
                                                                  head_dim**-0.5)
    assert torch.equal(alone[0], out[3])


@needs_kernels
@pytest.mark.parametrize("head_dim", [32, 64])
def test_paged_decode_attention_kernel_on_int8_pools_matches_the_dequantising_torch_formula(isa: str,
                                                                                             head_dim: int) -> None:
    num_blocks, block_size, heads = 30, 16, 3
    shape = (num_blocks, block_size, heads, head_dim)
    k_cache = quantize_kv(torch.randn(shape, generator=gen) * torch.rand(shape[:3] + (1,), generator=gen) * 3)
    v_cache = quantize_kv(torch.randn(shape, generator=gen))
    v_cache[4, 0] = quantize_kv(torch.zeros(heads, head_dim))  # an all-zero row: scale 0, values 0
    assert k_cache.dtype == torch.int8 and k_cache.shape[-1] == head_dim + 4
    q = (torch.randn(6, heads, head_dim, generator=gen) * 2).bfloat16()
    tables = torch.randperm(num_blocks, generator=gen)[:30].view(6, 5)
    tables[0, 0] = 4
    lens = torch.tensor([1, 16, 17, 80, 45, 2])
    meta = DecodeMetadata(torch.zeros(6, dtype=torch.long), tables, lens)
    expected = paged_decode_attention(q, k_cache, v_cache, meta).float()  # dequantises in fp32
    out = kernels.ops().paged_decode_attention(q, k_cache, v_cache, tables, lens, head_dim**-0.5)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    # one bf16 rounding step apart, plus q's int16 rounding (2^-16 of its absmax) moving scores of up to ~6 by ~1e-4:
    # a few 1e-4 of |V| ~ 1 (measured max 1.3e-4 beyond the bf16 step)
    assert ((out.float() - expected).abs() <= 2**-7 * expected.abs() + 5e-4).all()
    for b in range(1, 6):  # one position's V exactly, for a zero row and for any other
        one = kernels.ops().paged_decode_attention(q[b:b + 1], k_cache, v_cache, tables[b:b + 1],
                                                                    torch.tensor([1]), head_dim**-0.5)
        assert torch.equal(one[0], dequantize_kv(v_cache[tables[b, 0], 0], torch.bfloat16))
    assert not out[0].any()
    alone = kernels.ops().paged_decode_attention(q[3:4], k_cache, v_cache, tables[3:4], lens[3:4],
                                                                  head_dim**-0.5)
    assert torch.equal(alone[0], out[3])


@needs_kernels
def test_paged_decode_attention_kernel_rejects_bad_lengths(isa: str) -> None:
    cache = torch.zeros(4, 16, 2, 32, dtype=torch.bfloat16)
    q = torch.zeros(1, 2, 32, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="context_lens"):
        kernels.ops().paged_decode_attention(q, cache, cache, torch.zeros(1, 2, dtype=torch.long),
                                                              torch.tensor([33]), 1.0)


@needs_kernels
@torch.inference_mode()
def test_packed_model_decode_steps_with_the_attention_kernel_give_the_same_numbers(isa: str) -> None:
    from chattts_velocity.config import ModelConfig
    from chattts_velocity.model import ChatTTSLlama, allocate_kv_pairs, kernel_decode_attention, paged_decode_attention

    config = ModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=256)  # head_dim 32
    torch.manual_seed(0)
    model = ChatTTSLlama(config).eval()
    for param in model.parameters():
        param.normal_(0, 0.1)
    model.pack_linears("bfloat16")
    model.use_decode_attention(kernel_decode_attention)
    pools = allocate_kv_pairs(2, 8, 16, 2, 32, torch.bfloat16)
    for pool in (t for pair in pools for t in pair):
        pool.normal_()
    tables, lens = torch.tensor([[3, 5, 0], [1, 2, 7]]), torch.tensor([20, 40])
    meta = DecodeMetadata(torch.tensor([5 * 16 + 3, 7 * 16 + 7]), tables, lens)
    x = torch.randn(2, 64)
    with_kernel = model(x, lens - 1, pools, meta)
    model.use_decode_attention(paged_decode_attention)
    reference = model(x, lens - 1, pools, meta)
    assert (with_kernel - reference).abs().max().item() < 0.05 * reference.abs().max().item()


def test_int4_tiles_are_a_pure_reordering_of_values_and_scales() -> None:
    q = torch.randint(-8, 8, (8, 64), generator=gen, dtype=torch.int8)
    scales = torch.rand(8, 2, generator=gen)
    tiles, tile_scales = kernels.to_int4_tiles(q, scales)
    assert tiles.shape == (2, 2, 4, 16) and tiles.dtype == torch.uint8 and tile_scales.shape == (2, 2, 4)
    # tile t, group g, row r, byte j = (q[4t + r, 32g + j] + 8) | (q[4t + r, 32g + 16 + j] + 8) << 4
    assert tiles[1, 1, 2, 3].item() == (q[6, 35].item() + 8) | (q[6, 51].item() + 8) << 4
    back, back_scales = kernels.from_int4_tiles(tiles, tile_scales)
    assert torch.equal(back, q) and torch.equal(back_scales, scales)


def test_q8_rows_scale_each_groups_max_to_127_and_round_half_to_even() -> None:
    x = torch.zeros(2, 64)
    x[0, 32:] = torch.arange(32) - 8.0  # group 1: max |x| 23, so scale 23 / 127
    x[1, :32] = torch.linspace(-1, 1, 32)
    q, scales = kernels.quantize_q8_rows(x.bfloat16())
    assert scales[0, 0] == 0 and q[0, :32].eq(0).all()  # an all-zero group
    assert scales[0, 1] == torch.tensor(23.0) / 127 and q[0, 63] == 127 and q[0, 32] == -44  # -8 * 127 / 23 = -44.2
    error = q.double().reshape(2, 2, 32) * scales.double()[..., None] - x.bfloat16().double().reshape(2, 2, 32)
    assert error.abs().le(scales.double()[..., None] / 2 + 1e-12).all()
