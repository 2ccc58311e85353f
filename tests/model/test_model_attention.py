"""Step metadata, KV store and paged attention against a per-sequence dense re-computation."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity.model import (
    attention,
    build_attention_metadata,
    paged_attention,
    store_kvcache,
)

HEADS, HEAD_DIM = 2, 8


def test_metadata_indices_follow_their_definitions():
    q_lens, k_lens, bs = [3, 1, 5], [3, 10, 7], 4
    tables = [[7], [2, 0, 5], [4, 1]]
    meta = build_attention_metadata(q_lens, k_lens, tables, bs)
    positions, slots = [], []
    for q, k, table in zip(q_lens, k_lens, tables, strict=True):
        for p in range(k - q, k):
            positions.append(p)
            slots.append(table[p // bs] * bs + p % bs)
    assert meta.positions.tolist() == positions
    assert meta.slot_mapping.tolist() == slots
    assert meta.last_indices.tolist() == [2, 3, 8]
    assert meta.block_tables.tolist() == [[7, -1, -1], [2, 0, 5], [4, 1, -1]]
    assert not meta.decode_only and meta.max_k == 10
    mask = meta.attn_mask[:, 0]
    for b, (q, k) in enumerate(zip(q_lens, k_lens, strict=True)):
        for i in range(q):
            assert mask[b, i].tolist() == [j <= k - q + i for j in range(10)]


def test_metadata_rejects_inconsistent_lengths():
    with pytest.raises(ValueError, match="q_len <= k_len"):
        build_attention_metadata([4], [3], [[0]], 4)
    with pytest.raises(ValueError, match="too short"):
        build_attention_metadata([1], [5], [[0]], 4)


def test_uniform_decode_needs_no_mask():
    meta = build_attention_metadata([1, 1], [6, 6], [[0, 1], [2, 3]], 4)
    assert meta.decode_only and meta.attn_mask is None


def dense_reference(q, k_ctx, v_ctx, q_len):
    # q [q_len, heads, d]; k_ctx, v_ctx [k_len, heads, d]; causal with the new rows at the end
    k_len = k_ctx.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q.double(), k_ctx.double()) / HEAD_DIM**0.5
    allowed = torch.arange(k_len)[None, :] <= (k_len - q_len + torch.arange(q_len))[:, None]
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v_ctx.double()).float()


@pytest.mark.parametrize("group_bytes", [1 << 20, 1, 3000])  # one group; 1 sequence per group; 2 per group
@pytest.mark.parametrize("q_lens,k_lens", [([3, 1, 5, 1], [3, 10, 7, 1]), ([1, 1, 1], [4, 9, 2])])
def test_paged_attention_equals_dense_per_sequence(q_lens, k_lens, group_bytes, monkeypatch):
    monkeypatch.setattr(attention, "GROUP_BYTES", group_bytes)
    gen = torch.Generator().manual_seed(0)
    bs, num_blocks = 4, 16
    k_cache = torch.randn(num_blocks, bs, HEADS, HEAD_DIM, generator=gen)
    v_cache = torch.randn(num_blocks, bs, HEADS, HEAD_DIM, generator=gen)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [[free.pop() for _ in range(-(-k // bs))] for k in k_lens]
    meta = build_attention_metadata(q_lens, k_lens, tables, bs)
    n_new = sum(q_lens)
    q = torch.randn(n_new, HEADS, HEAD_DIM, generator=gen)
    k_new = torch.randn(n_new, HEADS, HEAD_DIM, generator=gen)
    v_new = torch.randn(n_new, HEADS, HEAD_DIM, generator=gen)
    store_kvcache(k_new, v_new, k_cache, v_cache, meta.slot_mapping)
    out = paged_attention(q, k_cache, v_cache, meta)
    assert out.shape == (n_new, HEADS, HEAD_DIM)

    start = 0
    for ql, kl, table in zip(q_lens, k_lens, tables, strict=True):
        slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(kl)])
        k_ctx = k_cache.flatten(0, 1)[slots]
        v_ctx = v_cache.flatten(0, 1)[slots]
        assert torch.equal(k_ctx[kl - ql :], k_new[start : start + ql])  # the store landed where expected
        expected = dense_reference(q[start : start + ql], k_ctx, v_ctx, ql)
        assert torch.allclose(out[start : start + ql], expected, rtol=0, atol=1e-5)
        start += ql



def test_int8_rows_round_trip_within_half_a_step_and_keep_their_scale_in_the_row():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, HEADS, HEAD_DIM, generator=gen) * torch.rand(5, HEADS, 1, generator=gen) * 4
    x[0, 1] = 0  # an all-zero row
    rows = attention.quantize_kv(x)
    assert rows.dtype == torch.int8 and rows.shape == (5, HEADS, HEAD_DIM + attention.KV_SCALE_BYTES)
    scale = x.abs().amax(-1, keepdim=True) / 127
    assert torch.equal(rows[..., HEAD_DIM:].contiguous().view(torch.float32), scale)
    assert rows[..., :HEAD_DIM].abs().max() == 127 and not rows[0, 1].any()
    assert ((attention.dequantize_kv(rows, torch.float32) - x).abs() <= scale / 2 * (1 + 1e-6)).all()


@pytest.mark.parametrize("q_lens,k_lens", [([3, 1, 5, 1], [3, 10, 7, 1]), ([1, 1, 1], [4, 9, 2])])
def test_paged_attention_over_int8_pools_equals_dense_over_the_dequantised_context(q_lens, k_lens):
    gen = torch.Generator().manual_seed(2)
    bs, num_blocks = 4, 16
    k_cache, v_cache = (attention.quantize_kv(torch.randn(num_blocks, bs, HEADS, HEAD_DIM, generator=gen))
                        for _ in range(2))
    assert attention.allocate_kv_pairs(1, num_blocks, bs, HEADS, HEAD_DIM, torch.int8)[0][0].shape == k_cache.shape
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables = [[free.pop() for _ in range(-(-k // bs))] for k in k_lens]
    meta = build_attention_metadata(q_lens, k_lens, tables, bs)
    q, k_new, v_new = (torch.randn(sum(q_lens), HEADS, HEAD_DIM, generator=gen) for _ in range(3))
    store_kvcache(k_new, v_new, k_cache, v_cache, meta.slot_mapping)  # quantised on store
    out = paged_attention(q, k_cache, v_cache, meta)
    start = 0
    for ql, kl, table in zip(q_lens, k_lens, tables, strict=True):
        slots = torch.tensor([table[p // bs] * bs + p % bs for p in range(kl)])
        k_ctx, v_ctx = (attention.dequantize_kv(c.flatten(0, 1)[slots], torch.float32) for c in (k_cache, v_cache))
        assert torch.equal(k_cache.flatten(0, 1)[slots][kl - ql:], attention.quantize_kv(k_new[start:start + ql]))
        expected = dense_reference(q[start:start + ql], k_ctx, v_ctx, ql)
        assert torch.allclose(out[start:start + ql], expected, rtol=0, atol=1e-5)
        start += ql
