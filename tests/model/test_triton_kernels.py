"""The Triton kernels (model/kernels/triton) against the torch paths they replace, on small shapes.

Without CUDA they run in Triton's CPU interpreter on CPU tensors, which needs TRITON_INTERPRET=1 before
`triton` is first imported (triton's own tl.zeros, tl.sum, ... are decorated at its import). Under pytest,
tests/model/conftest.py imports transformers, which imports triton, before this module runs: so set it in
the environment (`TRITON_INTERPRET=1 pytest -m triton`) or at the top of tests/conftest.py; setting it here
only helps when this module is imported first. Otherwise the module skips, saying why.
With CUDA (and TRITON_INTERPRET unset) every test runs on the GPU, and the `gpu` tests at the end add
ChatTTS-sized shapes and a no-host-sync check.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from chattts_velocity.engine.worker.sampling import logits_processors as lp
from chattts_velocity.engine.worker.sampling.sampler import step_seed
from chattts_velocity.model.attention import (
    DecodeMetadata,
    build_attention_metadata,
    paged_attention,
    paged_decode_attention,
    store_kvcache,
)
from chattts_velocity.model.kernels.triton import available
from chattts_velocity.model.layers import RMSNorm

if available() is not None:
    pytest.skip(f"Triton kernels unavailable: {available()}", allow_module_level=True)  # e.g. the reason above

from chattts_velocity.model.kernels.triton import decode_attention as da
from chattts_velocity.model.kernels.triton import norm, sampling
from chattts_velocity.model.kernels.triton import prefill_attention as tk

pytestmark = pytest.mark.triton
DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
needs_cuda = pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA, with TRITON_INTERPRET unset")
TOLERANCE = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}
# a fresh prompt, a chunked-prefill continuation, a decode row, a recompute of prompt + generated rows
# (more rows than one BLOCK_M tile) and a prompt ending on a block boundary
PREFILL_STEP = ([23, 10, 1, 45, 16], [23, 30, 17, 45, 16])
DECODE_LENS = [1, 4, 5, 16, 17, 37]  # one position, block boundaries, partial blocks


def paged_step(q_lens, k_lens, block_size, dtype, heads=4, kv_heads=4, head_dim=16, num_blocks=64, seed=0):
    """Metadata of one step, random pools (stale slots included) and the new rows' q, k, v (not stored yet)."""
    gen = torch.Generator().manual_seed(seed)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [[free.pop() for _ in range(-(-k_len // block_size))] for k_len in k_lens]
    meta = build_attention_metadata(q_lens, k_lens, tables, block_size, DEVICE)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(DEVICE, dtype)

    pool = (num_blocks, block_size, kv_heads, head_dim)
    rows = sum(q_lens)
    return meta, randn(*pool), randn(*pool), randn(rows, heads, head_dim), randn(rows, kv_heads, head_dim), \
        randn(rows, kv_heads, head_dim)


def expand_heads(cache: torch.Tensor, heads: int) -> torch.Tensor:
    # the torch paths take equal heads: repeat each kv head for its group of q heads
    return cache.repeat_interleave(heads // cache.shape[2], dim=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [4, 5, 16])
def test_decode_attention_matches_torch(dtype, block_size):
    meta, k_cache, v_cache, q, _, _ = paged_step([1] * len(DECODE_LENS), DECODE_LENS, block_size, dtype)
    context_lens = torch.tensor(DECODE_LENS, device=DEVICE)
    expected = paged_decode_attention(q, k_cache, v_cache, DecodeMetadata(meta.slot_mapping, meta.gather_blocks,
                                                                          context_lens))
    out = da.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, context_lens, split_len=32)
    torch.testing.assert_close(out, expected, **TOLERANCE[dtype])  # contexts 33 and 37: two splits, combined


@pytest.mark.parametrize("split_len", [32, 64])
def test_split_decode_equals_the_one_pass_decode(split_len):
    lens = [9, 0, 33, 100]  # 0: a padding entry
    meta, k_cache, v_cache, q, _, _ = paged_step([1] * 4, [9, 1, 33, 100], 8, torch.float32, heads=8, kv_heads=2)
    context_lens = torch.tensor(lens, device=DEVICE)
    workspace = da.Workspace.allocate(4, 8, 128, 16, torch.device(DEVICE), split_len)
    one = da.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, context_lens, split_len=128)
    for _ in range(2):  # the combining program leaves its counter at zero: the workspace serves the next launch
        split = da.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, context_lens, workspace,
                                          split_len=split_len)
        torch.testing.assert_close(split, one, **TOLERANCE[torch.float32])
        assert torch.equal(split[1], torch.zeros_like(split[1]))
        assert not workspace.counters.any()


def test_decode_attention_gqa_and_empty_context():
    lens = [9, 0, 33]  # 0 = a padding entry (e.g. of a CUDA graph batch): zeros, not NaN
    meta, k_cache, v_cache, q, _, _ = paged_step([1, 1, 1], [9, 1, 33], 8, torch.float32, heads=8, kv_heads=2)
    context_lens = torch.tensor(lens, device=DEVICE)
    out = da.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, context_lens, split_len=32)
    kept = torch.tensor([0, 2], device=DEVICE)
    decode = DecodeMetadata(meta.slot_mapping[kept], meta.gather_blocks[kept], context_lens[kept])
    expected = paged_decode_attention(q[kept], expand_heads(k_cache, 8), expand_heads(v_cache, 8), decode)
    torch.testing.assert_close(out[kept], expected, **TOLERANCE[torch.float32])
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def prefill_args(meta):
    cu_q_lens = torch.tensor([0, *meta.q_lens], device=DEVICE).cumsum(0)
    return cu_q_lens, torch.tensor(meta.k_lens, device=DEVICE), meta.block_tables, max(meta.q_lens)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [4, 5, 16])
def test_prefill_attention_matches_paged_attention(dtype, block_size):
    meta, k_cache, v_cache, q, k, v = paged_step(*PREFILL_STEP, block_size=block_size, dtype=dtype)
    store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping)
    expected = paged_attention(q, k_cache, v_cache, meta)
    out = tk.paged_prefill_attention(q, k_cache, v_cache, *prefill_args(meta))
    torch.testing.assert_close(out, expected, **TOLERANCE[dtype])


def test_prefill_attention_gqa_and_small_tiles():
    meta, k_cache, v_cache, q, k, v = paged_step(*PREFILL_STEP, block_size=16, dtype=torch.float32,
                                                 heads=8, kv_heads=2)
    store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping)
    expected = paged_attention(q, expand_heads(k_cache, 8), expand_heads(v_cache, 8), meta)
    out = tk.paged_prefill_attention(q, k_cache, v_cache, *prefill_args(meta), block_m=16, block_n=16)
    torch.testing.assert_close(out, expected, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_layers(dtype):
    torch.manual_seed(0)
    layer = RMSNorm(96, eps=1e-5).to(DEVICE)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
    layer = layer.to(dtype)
    wide = torch.randn(7, 2 * 96, device=DEVICE, dtype=dtype)
    x, scaled = wide[:, :96], wide[:, 96:] * 3  # x: strided rows
    with torch.no_grad():
        torch.testing.assert_close(norm.rms_norm(x, layer.weight, 1e-5), layer(x), **TOLERANCE[dtype])
        torch.testing.assert_close(norm.rms_norm(scaled, layer.weight, 1e-5), layer(scaled), **TOLERANCE[dtype])


def random_logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=gen) * 3).round(decimals=1).to(DEVICE)  # rounding makes ties


def test_temperature_and_penalty_match_logits_processors():
    logits = random_logits(6, 5000)  # more than one BLOCK_V of columns
    temperatures = torch.tensor([0.3, 0.7, 1.0, 1.0, 0.5, 2.0], device=DEVICE)
    penalties = torch.tensor([1.05, 1.3, 1.0, 2.0, 1.05, 1.2], device=DEVICE)
    history = torch.tensor([[7, 7, 7, 4999, 0, -1, -1, -1], [1, 2, 3, 4, 5, 6, 7, 8], [9, 9, -1, -1, -1, -1, -1, -1],
                            [5, 5, 5, 5, 5, 5, 5, 5], [-1] * 8, [100, 200, 100, 200, 100, 3000, -1, -1]],
                           device=DEVICE)
    expected = lp.apply_repetition_penalty(lp.apply_temperature(logits.clone(), temperatures), history, penalties)
    out = sampling.apply_temperature_and_penalty(logits.clone(), temperatures, history, penalties)
    torch.testing.assert_close(out, expected, rtol=2e-7, atol=0)
    empty = sampling.apply_temperature_and_penalty(logits.clone(), temperatures, history[:, :0], penalties)
    assert torch.equal(empty, lp.apply_temperature(logits.clone(), temperatures))


def test_penalty_clamps_non_finite_values_like_the_cpu_chain():
    logits = random_logits(2, 300)
    logits[:, 5] = torch.tensor([2.0, -2.0], device=DEVICE)
    logits[:, 6] = 0.0
    history = torch.tensor([[5] * 16 + [6] * 16 + list(range(7, 40))] * 2, device=DEVICE)  # 65 ids: 5 tiles
    penalties = torch.tensor([1e-3, 1e-3], device=DEVICE)  # 1e-3 ** 16 underflows: s / 0 and 0 / 0
    ones = torch.ones(2, device=DEVICE)
    expected = lp.apply_repetition_penalty(logits.clone(), history, penalties)
    out = sampling.apply_temperature_and_penalty(logits.clone(), ones, history, penalties)
    assert bool(out.isfinite().all())
    torch.testing.assert_close(out, expected, rtol=2e-7, atol=0)


def test_top_p_top_k_and_eos_masks_equal_torch():
    logits = random_logits(7, 626)
    top_p = torch.tensor([1.0, 0.7, 0.9, 1.0, 0.5, 0.01, 0.8], device=DEVICE)
    top_k = torch.tensor([0, 0, 20, 1, 5, 0, 200], device=DEVICE)
    expected = lp.apply_top_k(lp.apply_top_p(logits.clone(), top_p), top_k)
    out = sampling.apply_top_p_top_k(logits.clone(), top_p, top_k)
    assert torch.equal(out, expected)
    assert (expected[1:].isinf().sum(1) > 0).all()  # every active row dropped something
    rows = torch.tensor([True, False, True, False, False, True, False], device=DEVICE)
    eos_ids = torch.tensor([625, 625, 3, 0, 625, 10, 625], device=DEVICE)
    assert torch.equal(sampling.mask_eos(out, rows, eos_ids), lp.mask_eos(expected, rows, eos_ids))


def test_noise_is_keyed_by_seed_and_step_only():
    seeds = [step_seed(seed, step) for seed, step in [(1, 0), (1, 1), (2, 0), (2**63 + 5, 9), (3, 3)]]
    batch = sampling.exponential_noise(sampling.noise_seeds(seeds, DEVICE), num_rows=4, vocab=1500)
    alone = sampling.exponential_noise(sampling.noise_seeds(seeds[3:4], DEVICE), num_rows=4, vocab=1500)
    assert torch.equal(batch[12:16], alone)
    again = sampling.exponential_noise(sampling.noise_seeds(seeds, DEVICE), num_rows=4, vocab=1500)
    assert torch.equal(batch, again)
    assert not torch.equal(batch[0:4], batch[4:8])  # the step changes the noise
    assert not torch.equal(batch[0], batch[1])  # so does the codebook row
    assert (batch > 0).all() and batch.isfinite().all()
    # Exp(1): mean 1, median ln 2
    assert abs(batch.mean().item() - 1) < 0.02
    assert abs((batch < 0.6931).float().mean().item() - 0.5) < 0.01


def test_sample_is_batch_invariant_and_equals_torch_with_the_same_noise():
    logits = random_logits(5 * 4, 626, seed=1)
    seeds = sampling.noise_seeds([step_seed(s, 7) for s in range(5)], DEVICE)
    ids = sampling.sample(logits, seeds, num_rows=4)  # [5, 4]
    assert ids.shape == (5, 4)
    for s in range(5):
        assert torch.equal(sampling.sample(logits[4 * s:4 * s + 4], seeds[s:s + 1], num_rows=4), ids[s:s + 1])
    noise = sampling.exponential_noise(seeds, 4, 626)
    assert torch.equal(ids.flatten(), (logits.softmax(-1) / noise).argmax(-1))
    peaked = torch.full((1, 626), -30.0, device=DEVICE)
    peaked[0, 17] = 30.0
    assert sampling.sample(peaked, seeds[:1], num_rows=1).item() == 17


def test_a_dropped_column_never_wins_where_the_noise_is_zero():
    # this step seed's noise is exactly 0 at row 1, column 387 (u rounds to 1): torch's softmax / noise / argmax
    # takes the NaN of 0 / 0 there for the maximum, and would return a column whose logit is -inf
    seeds = torch.tensor([8623160922125302522], device=DEVICE)
    noise = sampling.exponential_noise(seeds, 4, 626)
    assert noise[1, 387].item() == 0
    logits = torch.full((4, 626), float("-inf"), device=DEVICE)
    logits[:, 100:103] = torch.tensor([0.5, 1.0, 2.0], device=DEVICE)  # three kept columns
    assert (logits.softmax(-1) / noise).argmax(-1)[1].item() == 387
    tokens = sampling.sample(logits, seeds, num_rows=4)
    assert bool(((tokens >= 100) & (tokens < 103)).all())


def test_bad_inputs_raise_value_error():
    _, k_cache, v_cache, q, _, _ = paged_step([1], [4], 4, torch.float32, heads=3)
    with pytest.raises(ValueError, match="q: need"):
        da.paged_decode_attention(q, k_cache, v_cache, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1))
    with pytest.raises(ValueError, match="logits"):
        sampling.sample(torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, dtype=torch.int64), 1)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chattts_sized_step_on_gpu(dtype):
    # 12 heads of 64, blocks of 16: a 600-row prompt next to two decode rows (contexts up to 2048)
    q_lens, k_lens = [600, 1, 1], [600, 2048, 77]
    meta, k_cache, v_cache, q, k, v = paged_step(q_lens, k_lens, 16, dtype, heads=12, kv_heads=12, head_dim=64,
                                                 num_blocks=512)
    store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping)
    expected = paged_attention(q, k_cache, v_cache, meta)
    out = tk.paged_prefill_attention(q, k_cache, v_cache, *prefill_args(meta))
    torch.testing.assert_close(out, expected, **TOLERANCE[dtype])
    context_lens = torch.tensor(k_lens, device=DEVICE)
    decode = DecodeMetadata(meta.slot_mapping[meta.last_indices], meta.gather_blocks, context_lens)
    rows = q[meta.last_indices]  # each sequence's last new row, over its whole context
    out = da.paged_decode_attention(rows, k_cache, v_cache, meta.block_tables, context_lens)
    torch.testing.assert_close(out, paged_decode_attention(rows, k_cache, v_cache, decode), **TOLERANCE[dtype])


@pytest.mark.gpu
@needs_cuda
def test_sampling_never_syncs_the_host():
    logits = random_logits(32 * 4, 626)
    rows = torch.ones(128, dtype=torch.bool, device=DEVICE)
    history = torch.randint(-1, 626, (128, 16), device=DEVICE)
    params = [torch.full((128,), value, device=DEVICE) for value in (0.7, 1.05, 0.7)]
    top_k, eos = torch.full((128,), 20, device=DEVICE), torch.full((128,), 625, device=DEVICE)
    seeds = sampling.noise_seeds([step_seed(s, 0) for s in range(32)], DEVICE)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sampling.apply_temperature_and_penalty(logits, params[0], history, params[1])
        sampling.apply_top_p_top_k(logits, params[2], top_k)
        ids = sampling.sample(sampling.mask_eos(logits, rows, eos), seeds, num_rows=4)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert ids.shape == (32, 4) and not (ids.cpu() == 625).any()
