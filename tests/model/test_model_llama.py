"""Paged ChatTTSLlama against transformers' LlamaModel (SDPA, fp32), one DynamicCache per sequence."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaModel

from chattts_velocity.model import attention

H = 64
TOL = 1e-5


def hf_incremental(hf: LlamaModel, chunks: list[torch.Tensor]) -> list[torch.Tensor]:
    """Feed one sequence's chunks [q, H] one after another through HF with its own cache."""
    cache = DynamicCache()
    outs = []
    with torch.no_grad():
        for chunk in chunks:
            out = hf(inputs_embeds=chunk[None], past_key_values=cache, use_cache=True).last_hidden_state
            outs.append(out[0])
    return outs


def max_err(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("block_size,group_bytes", [(4, 1 << 20), (16, 1 << 20), (4, 40_000)])
def test_mixed_prefill_then_decode_matches_hf(hf_llama, make_runner, block_size, group_bytes, monkeypatch):
    monkeypatch.setattr(attention, "GROUP_BYTES", group_bytes)  # 40 kB: 4 -> 1 sequences per group as contexts grow
    gen = torch.Generator().manual_seed(1)
    prompt_lens = [5, 17, 1, 9]  # mixed lengths, crossing block edges for block_size 4
    steps = {i: [torch.randn(n, H, generator=gen)] for i, n in enumerate(prompt_lens)}
    for _ in range(32):
        for chunks in steps.values():
            chunks.append(torch.randn(1, H, generator=gen))

    runner = make_runner(num_blocks=96, block_size=block_size)
    paged = {i: [] for i in steps}
    for t in range(33):
        outs = runner.step([(i, steps[i][t]) for i in steps])
        for i, out in zip(steps, outs, strict=True):
            paged[i].append(out)

    for i, chunks in steps.items():
        assert max_err(paged[i], hf_incremental(hf_llama, chunks)) <= TOL


def test_chunked_prefill_equals_one_shot_and_hf(hf_llama, make_runner):
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randn(23, H, generator=gen)
    other_prompt = torch.randn(6, H, generator=gen)
    decodes = [torch.randn(1, H, generator=gen) for _ in range(3)]

    one_shot = make_runner(block_size=4, seed=3).step([(0, prompt)])[0]

    # the chunks share their steps with a sequence that is decoding (mixed batches)
    runner = make_runner(block_size=4, seed=4)
    runner.step([(1, other_prompt)])
    chunks = [prompt[:8], prompt[8:16], prompt[16:]]
    pieces = []
    for chunk, dec in zip(chunks, decodes, strict=True):
        outs = runner.step([(1, dec), (0, chunk)])
        pieces.append(outs[1])
    chunked = torch.cat(pieces)

    assert (chunked - one_shot).abs().max().item() <= TOL
    assert (chunked - hf_incremental(hf_llama, [prompt])[0]).abs().max().item() <= TOL
    ref_other = hf_incremental(hf_llama, [other_prompt, *decodes])
    runner_other = make_runner(block_size=4, seed=5)
    got_other = [runner_other.step([(1, c)])[0] for c in [other_prompt, *decodes]]
    assert max_err(got_other, ref_other) <= TOL


def test_decode_fast_path_equals_general_path(make_runner):
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randn(n, H, generator=gen) for n in (3, 11, 6)]
    fast, general = make_runner(block_size=4, seed=6), make_runner(block_size=4, seed=7)
    for r in (fast, general):
        r.step(list(enumerate(prompts)))
    for _ in range(4):
        tokens = [torch.randn(1, H, generator=gen) for _ in prompts]
        a = fast.step(list(enumerate(tokens)))
        b = general.step(list(enumerate(tokens)), force_general=True)
        assert max_err(a, b) <= 1e-6


def test_forward_rejects_wrong_number_of_kv_pools(paged_llama, make_runner):
    from chattts_velocity.model import build_attention_metadata

    runner = make_runner()
    meta = build_attention_metadata([2], [2], [[0]], runner.block_size)
    with pytest.raises(ValueError, match="kv_caches"):
        paged_llama(torch.zeros(2, H), meta.positions, runner.kv[:1], meta)
