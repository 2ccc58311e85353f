"""Embed: checkpoint keys, weight-norm heads, input embeddings and speaker rows."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils import parametrize

from chattts_velocity.model import Embed

H, V_AUDIO, V_TEXT, NUM_VQ = 64, 626, 21178, 4

# asset/Embed.safetensors keys, spec section 2.3
SPEC_KEYS = (
    [f"emb_code.{q}.weight" for q in range(4)]
    + ["emb_text.weight", "head_text.parametrizations.weight.original0", "head_text.parametrizations.weight.original1"]
    + [f"head_code.{q}.parametrizations.weight.original{i}" for q in range(4) for i in (0, 1)]
)


@pytest.fixture(scope="module")
def embed() -> Embed:
    torch.manual_seed(0)
    module = Embed(H, V_AUDIO, V_TEXT, NUM_VQ)
    with torch.no_grad():  # g away from ||v|| so the normalisation matters
        for p in module.parameters():
            p.normal_()
    return module.eval()


def random_prompt(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, generator=gen) < 0.5
    ids = torch.randint(0, V_AUDIO, (n, NUM_VQ), generator=gen)
    text_ids = torch.randint(0, V_TEXT, (n,), generator=gen)
    ids[mask] = text_ids[mask, None].expand(-1, NUM_VQ)  # text ids repeated over the channels
    return ids, mask


def test_state_dict_keys_and_shapes_follow_spec(embed):
    sd = embed.state_dict()
    assert sorted(sd) == sorted(SPEC_KEYS)
    assert sd["head_text.parametrizations.weight.original0"].shape == (V_TEXT, 1)
    assert sd["head_code.3.parametrizations.weight.original1"].shape == (V_AUDIO, H)


def test_from_state_dict_reads_sizes_from_shapes(embed):
    sd = {k: v.clone() for k, v in embed.state_dict().items() if not k.startswith(("emb_code.3", "head_code.3"))}
    small = Embed.from_state_dict(sd)
    assert (small.hidden_size, small.num_audio_tokens, small.num_text_tokens, small.num_vq) == (H, V_AUDIO, V_TEXT, 3)
    h = torch.randn(2, H)
    assert torch.equal(small.text_logits(h), embed.text_logits(h))


def test_from_state_dict_rejects_bad_keys(embed):
    sd = dict(embed.state_dict())
    with pytest.raises(ValueError, match="unexpected keys.*bogus"):
        Embed.from_state_dict({**sd, "bogus": torch.zeros(1)})
    del sd["head_text.parametrizations.weight.original0"]
    with pytest.raises(ValueError, match="missing keys.*head_text"):
        Embed.from_state_dict(sd)


@pytest.mark.parametrize("num_rows", [1, 5])
def test_effective_head_weight_is_weight_norm(embed, num_rows):
    h = torch.randn(num_rows, H)
    with parametrize.cached(), torch.no_grad():
        w_text = embed.head_text.weight
        w_code = [head.weight for head in embed.head_code]
    p = embed.head_text.parametrizations.weight
    by_formula = p.original1 * (p.original0 / p.original1.norm(dim=1, keepdim=True))
    assert torch.allclose(w_text, by_formula, rtol=1e-6, atol=1e-6)
    assert torch.equal(embed.text_logits(h), F.linear(h, w_text))
    code = embed.code_logits(h)
    assert code.shape == (num_rows, NUM_VQ, V_AUDIO) and code.dtype == torch.float32
    for q in range(NUM_VQ):
        assert torch.equal(code[:, q], F.linear(h, w_code[q]))


def test_head_cache_follows_loaded_and_edited_weights(embed):
    module = Embed.from_state_dict({k: v.clone() for k, v in embed.state_dict().items()})
    h = torch.randn(3, H)
    before = module.text_logits(h)
    module.load_state_dict({k: v * 2 if k.endswith("original0") else v for k, v in embed.state_dict().items()})
    assert torch.allclose(module.text_logits(h), 2 * before, rtol=1e-5, atol=1e-5)
    cached = module.code_logits(h)
    with torch.no_grad():  # an in-place edit is invisible to the cache until refresh_weights()
        module.head_code[0].parametrizations.weight.original0.mul_(3)
    stale = module.code_logits(h)
    assert torch.equal(stale, cached)
    module.refresh_weights()
    fresh = module.code_logits(h)
    assert torch.allclose(fresh[:, 0], 3 * stale[:, 0], rtol=1e-5, atol=1e-5)
    assert torch.equal(fresh[:, 1:], stale[:, 1:])


def test_embed_matches_explicit_lookups(embed):
    ids, mask = random_prompt(40, seed=1)
    out = embed.embed(ids, mask)
    assert out.shape == (40, H)
    for n in range(40):
        if mask[n]:
            expected = embed.emb_text.weight[ids[n, 0]]
        else:
            expected = sum(embed.emb_code[q].weight[ids[n, q]] for q in range(NUM_VQ))
        assert torch.allclose(out[n], expected, rtol=0, atol=1e-6)


def test_code_sum_is_bit_identical_to_stack_then_sum(embed):
    ids, mask = random_prompt(64, seed=2)
    codes = ids[~mask]
    with torch.no_grad():  # the reference order: stack the 4 lookups on dim 2 of [M, H, 4], sum dim 2
        reference = torch.stack([embed.emb_code[q](codes[:, q]) for q in range(NUM_VQ)], 2).sum(2)
    assert torch.equal(embed.embed(ids, mask)[~mask], reference)
    assert torch.equal(embed.embed_codes(codes), reference)


def test_batched_embed_equals_flat(embed):
    ids, mask = random_prompt(24, seed=3)
    batched = embed.embed(ids.view(2, 12, NUM_VQ), mask.view(2, 12))
    assert batched.shape == (2, 12, H)
    assert torch.equal(batched.view(24, H), embed.embed(ids, mask))


def test_embed_rejects_bad_shapes(embed):
    with pytest.raises(ValueError, match="input_ids"):
        embed.embed(torch.zeros(5, 3, dtype=torch.int64), torch.zeros(5, dtype=torch.bool))


def test_apply_speaker_replaces_only_given_rows(embed):
    ids, mask = random_prompt(10, seed=4)
    emb = embed.embed(ids, mask)
    original = emb.clone()
    spk = torch.randn(H)
    out = embed.apply_speaker(emb, [2, 7], spk)
    assert out is emb
    assert torch.equal(emb[2], spk) and torch.equal(emb[7], spk)
    keep = [n for n in range(10) if n not in (2, 7)]
    assert torch.equal(emb[keep], original[keep])
    with pytest.raises(ValueError, match="spk_emb"):
        embed.apply_speaker(emb, [0], torch.randn(H + 1))


def test_text_logits_shape(embed):
    assert embed.text_logits(torch.randn(3, H)).shape == (3, V_TEXT)
