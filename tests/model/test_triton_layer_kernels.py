"""The triton backend's fused layer kernels (gemm.py, qkv.py, decode_attention.py) against the torch layers, and
their batch invariance: a row's bits are the same alone, in a batch of 3 and in a batch of 64.

Runs on CUDA, or in Triton's CPU interpreter (TRITON_INTERPRET=1 before triton is imported: see
test_triton_kernels.py), on small shapes.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from chattts_velocity.model.attention import DecodeMetadata, paged_decode_attention, store_kvcache
from chattts_velocity.model.kernels.triton import available
from chattts_velocity.model.layers import RMSNorm, RotaryEmbedding

if available() is not None:
    pytest.skip(f"Triton kernels unavailable: {available()}", allow_module_level=True)

from chattts_velocity.model.kernels.triton import decode_attention as da
from chattts_velocity.model.kernels.triton import gemm, qkv

pytestmark = pytest.mark.triton
DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
TOLERANCE = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}
DTYPES = [torch.float32, torch.bfloat16]
SMALL_K = gemm.Tile(block_m=16, block_n=32, block_k=32)  # several K chunks and column tiles on the small shapes
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 96, 4, 2, 16, 80
BATCHES = ([40], [5, 6, 7], list(range(64)))  # one row, three, 64 (four M tiles)


def randn(gen, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(DEVICE, dtype)


def norm_of(weight: torch.Tensor) -> RMSNorm:
    norm = RMSNorm(weight.shape[0], eps=1e-5).to(DEVICE, weight.dtype)
    norm.weight.data = weight
    return norm


def rows_are_batch_invariant(run, rows: torch.Tensor) -> None:
    """run(subset of rows) -> outputs, one per row: equal bits for a row alone, among 3 and among 64."""
    full = run(rows)
    for batch in BATCHES[:2]:
        assert torch.equal(run(rows[batch]), full[batch]), f"rows {batch}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_residual_linear_equals_linear_plus_residual_and_is_batch_invariant(dtype):
    gen = torch.Generator().manual_seed(0)
    x, w = randn(gen, 64, HIDDEN, dtype=dtype), randn(gen, INTER, HIDDEN, dtype=dtype, scale=0.1)
    residual = randn(gen, 64, INTER, dtype=dtype)
    out = gemm.residual_linear(x, w, residual, tile=SMALL_K)
    torch.testing.assert_close(out, residual + F.linear(x, w), **TOLERANCE[dtype])
    assert out.dtype == dtype
    rows_are_batch_invariant(lambda idx: gemm.residual_linear(x[idx], w, residual[idx]), torch.arange(64))


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_equals_f_linear_in_float32_and_is_batch_invariant(dtype):
    gen = torch.Generator().manual_seed(2)
    x, w = randn(gen, 64, HIDDEN, dtype=dtype), randn(gen, 4 * 50, HIDDEN, dtype=dtype, scale=0.1)
    out = gemm.linear(x, w, tile=SMALL_K)
    assert out.dtype == torch.float32 and out.shape == (64, 4 * 50)
    torch.testing.assert_close(out, F.linear(x, w).float(), **TOLERANCE[dtype])
    rows_are_batch_invariant(lambda idx: gemm.linear(x[idx], w), torch.arange(64))


def test_heads_through_the_triton_gemm_are_row_invariant_logits():
    """Embed.logits_rowwise with the GEMM the triton backend sets on CUDA: the code and text heads' logits of a row
    are the same bits alone, among 3 and among 64, and equal the reference heads to rounding."""
    from chattts_velocity.model import Embed

    gen = torch.Generator().manual_seed(3)
    embed = Embed(HIDDEN, 50, 70, 4).to(DEVICE)
    embed.head_gemm = gemm.linear
    hidden = randn(gen, 64, HIDDEN)
    for name, reference in (("code", embed.code_logits), ("text", embed.text_logits)):
        torch.testing.assert_close(embed.logits_rowwise(hidden, name), reference(hidden), rtol=1e-5, atol=1e-5)
        rows_are_batch_invariant(lambda idx, name=name: embed.logits_rowwise(hidden[idx], name), torch.arange(64))


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_gate_up_equals_the_mlp_front_and_is_batch_invariant(dtype):
    gen = torch.Generator().manual_seed(1)
    x, norm_weight = randn(gen, 64, HIDDEN, dtype=dtype), randn(gen, HIDDEN, dtype=dtype).abs() + 0.5
    gate_up = randn(gen, 2 * INTER, HIDDEN, dtype=dtype, scale=0.1)
    gate, up = F.linear(norm_of(norm_weight)(x), gate_up).chunk(2, dim=-1)
    with torch.no_grad():
        out = gemm.norm_gate_up(x, norm_weight, gate_up, 1e-5, tile=SMALL_K)
        torch.testing.assert_close(out, F.silu(gate) * up, **TOLERANCE[dtype])
    rows_are_batch_invariant(lambda idx: gemm.norm_gate_up(x[idx], norm_weight, gate_up, 1e-5), torch.arange(64))


def qkv_case(dtype, seed=2):
    gen = torch.Generator().manual_seed(seed)
    x, norm_weight = randn(gen, 64, HIDDEN, dtype=dtype), randn(gen, HIDDEN, dtype=dtype).abs() + 0.5
    weight = randn(gen, (HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN, dtype=dtype, scale=0.1)
    positions = torch.randint(0, 200, (64,), generator=gen).to(DEVICE)
    slots = torch.randperm(40 * 4, generator=gen)[:64].to(DEVICE)  # 40 blocks of 4
    rotary = RotaryEmbedding(HEAD_DIM, 256, 10000.0).to(DEVICE)
    return x, norm_weight, weight, positions, slots, rotary


def pools(dtype):
    return (torch.zeros(40, 4, KV_HEADS, HEAD_DIM, dtype=dtype, device=DEVICE) for _ in range(2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_qkv_rope_equals_norm_projection_rope_and_store(dtype):
    x, norm_weight, weight, positions, slots, rotary = qkv_case(dtype)
    slots[3] = -1  # a padding row: its q is computed, its K/V written nowhere
    with torch.no_grad():
        q, k, v = F.linear(norm_of(norm_weight)(x), weight).split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM,
                                                                    KV_HEADS * HEAD_DIM], dim=-1)
        expected_q, expected_k = rotary(positions, q.reshape(64, HEADS, HEAD_DIM).float(),
                                        k.reshape(64, KV_HEADS, HEAD_DIM).float())
    expected_pools, got_pools = list(pools(dtype)), list(pools(dtype))
    kept = slots >= 0
    store_kvcache(expected_k[kept], v.reshape(64, KV_HEADS, HEAD_DIM)[kept], *expected_pools, slots[kept])
    out = qkv.norm_qkv_rope(x, norm_weight, weight, positions, slots, rotary.cos_cache, rotary.sin_cache,
                            *got_pools, 1e-5, tile=SMALL_K)
    assert out.shape == (64, HEADS, HEAD_DIM) and out.dtype == dtype
    torch.testing.assert_close(out, expected_q.to(dtype), **TOLERANCE[dtype])
    for got, expected in zip(got_pools, expected_pools, strict=True):
        torch.testing.assert_close(got, expected, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_qkv_rope_is_batch_invariant(dtype):
    x, norm_weight, weight, positions, slots, rotary = qkv_case(dtype, seed=3)

    def run(idx):
        k_pool, v_pool = pools(dtype)
        q = qkv.norm_qkv_rope(x[idx], norm_weight, weight, positions[idx], slots[idx], rotary.cos_cache,
                              rotary.sin_cache, k_pool, v_pool, 1e-5)
        flat = slots[idx]
        return torch.cat([q.flatten(1), k_pool.flatten(0, 1)[flat].flatten(1), v_pool.flatten(0, 1)[flat].flatten(1)],
                         dim=1)

    rows_are_batch_invariant(run, torch.arange(64))


def decode_case(dtype, seed=4):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 100, (64,), generator=gen)
    lens[:4] = torch.tensor([1, 32, 33, 96])  # one position, split boundaries
    width = 25  # blocks of 4: up to 100 positions
    tables = torch.randint(0, 200, (64, width), generator=gen).to(DEVICE)
    k_pool, v_pool = randn(gen, 200, 4, KV_HEADS, HEAD_DIM, dtype=dtype), randn(gen, 200, 4, KV_HEADS, HEAD_DIM,
                                                                                   dtype=dtype)
    return randn(gen, 64, HEADS, HEAD_DIM, dtype=dtype), k_pool, v_pool, tables, lens.to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_is_batch_invariant_and_ignores_the_table_width(dtype):
    q, k_pool, v_pool, tables, lens = decode_case(dtype)
    expected = paged_decode_attention(q.float(), k_pool.float().repeat_interleave(2, 2),
                                      v_pool.float().repeat_interleave(2, 2),
                                      DecodeMetadata(lens, tables, lens))  # slot_mapping unused
    workspace = da.Workspace.allocate(64, HEADS, 200, HEAD_DIM, torch.device(DEVICE), split_len=32)

    def run(idx, extra_columns=0):
        table = torch.cat([tables[idx], tables[idx, :extra_columns]], dim=1)  # wider: more (empty) splits
        return da.paged_decode_attention(q[idx], k_pool, v_pool, table, lens[idx], workspace, split_len=32)

    full = run(torch.arange(64))
    torch.testing.assert_close(full.float(), expected, **TOLERANCE[dtype])
    rows_are_batch_invariant(run, torch.arange(64))
    assert torch.equal(run(torch.tensor([3]), extra_columns=20), full[3:4])


def test_split_programs_follow_the_rows_and_the_longest_context():
    assert da.split_programs(1, 12, 32) == 32  # alone: every split of a 4096-position table has its program
    assert da.split_programs(64, 12, 32) == 4 and da.split_programs(256, 12, 32) == 1
    assert da.split_programs(1, 12, 32, max_context=600) == 8  # 5 splits of 128, bucketed to a power of two
    assert da.split_programs(1, 12, 5) == 8 and da.split_programs(1, 12, 32, max_context=0) == 1


def test_decode_attention_bits_do_not_depend_on_its_grid(monkeypatch):
    # a row's bits alone (4 split programs) and among 64 (1 program looping over its splits) and with any
    # max_context (even one below the true longest context: programs then loop over more splits)
    monkeypatch.setattr(da, "PROGRAM_TARGET", 64)
    q, k_pool, v_pool, tables, lens = decode_case(torch.float32, seed=5)
    workspace = da.Workspace.allocate(64, HEADS, 200, HEAD_DIM, torch.device(DEVICE), split_len=32)

    def run(idx, max_context=None):
        return da.paged_decode_attention(q[idx], k_pool, v_pool, tables[idx], lens[idx], workspace, split_len=32,
                                         max_context=max_context)

    assert da.split_programs(64, HEADS, 4) == 1 and da.split_programs(1, HEADS, 4) == 4
    full = run(torch.arange(64))
    rows_are_batch_invariant(run, torch.arange(64))
    for max_context in (1, 40, 100):
        assert torch.equal(run(torch.arange(64), max_context), full), max_context
        assert torch.equal(run(torch.tensor([3, 40]), max_context), full[[3, 40]]), max_context
    assert not workspace.counters.any()
