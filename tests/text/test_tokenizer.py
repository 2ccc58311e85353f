"""Prompt layout with the real ChatTTS tokenizer (upstream's prompt decoration, speaker and code prompts)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from chattts_velocity.schema import Prompt
from chattts_velocity.text import (
    Tokenizer,
    decode_spk_emb,
    encode_prompt,
    normalize_spk_emb,
    pad_left,
    sample_random_speaker,
)

ASSET = Path(__file__).resolve().parents[2] / ".." / "shared" / "chattts-asset"
pytestmark = pytest.mark.skipif(not (ASSET / "tokenizer").is_dir(), reason=f"no tokenizer at {ASSET}")

# Ids from the spec's table (section 3).
STTS, PTTS, SBREAK, PBREAK, UV_BREAK, LAUGH = 21131, 21132, 21134, 21135, 21137, 21142
SPK_EMB, EMPTY_SPK, BREAK_0, LAUGH_0, ORAL_0, SPEED_0 = 21143, 21144, 21147, 21155, 21158, 21168


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer(ASSET / "tokenizer")


def test_special_ids(tok: Tokenizer) -> None:
    assert (tok.spk_emb_id, tok.break_0_id, tok.eos_id, tok.vocab_size) == (SPK_EMB, BREAK_0, 21136, 21178)


def test_encode_has_no_specials_and_no_truncation(tok: Tokenizer) -> None:
    one = tok.encode("你")
    assert len(one) == 1 and one[0] not in (101, 102)
    assert tok.encode("你" * 600) == one * 600


def test_decode_matches_spec_example(tok: Tokenizer) -> None:
    ids = tok.encode("[Sbreak]你好，hello world![uv_break]chat?[Pbreak]")
    assert ids[0] == SBREAK and ids[-1] == PBREAK
    assert tok.decode(ids) == "[Sbreak] 你 好 ， hello world! [uv_break] chat? [Pbreak]"
    assert tok.decode(torch.tensor(ids)) == tok.decode(ids)


def test_code_prompt_full_layout(tok: Tokenizer) -> None:
    spk = torch.randn(768).half()
    smp = torch.randint(0, 625, (4, 9))
    p = tok.code_prompt("今天天气真好", spk_emb=spk, txt_smp="参考文本", spk_smp=smp)
    text_ids = [STTS, SPK_EMB] + tok.encode("参考文本") + [SPEED_0 + 5] + tok.encode("今天天气真好") + [PTTS]
    n = len(text_ids)
    assert isinstance(p, Prompt) and len(p) == n + 9
    assert p.input_ids.dtype == torch.int64 and p.input_ids.shape == (n + 9, 4)
    assert p.input_ids[:n, 0].tolist() == text_ids
    assert torch.equal(p.input_ids[:n], p.input_ids[:n, :1].expand(-1, 4))
    assert torch.equal(p.input_ids[n:], smp.t())
    assert p.text_mask.tolist() == [True] * n + [False] * 9
    assert p.spk_positions == (1,)
    assert p.spk_emb.dtype == torch.float32 and torch.equal(p.spk_emb, normalize_spk_emb(spk))


def test_code_prompt_strips_tags_and_whitespace(tok: Tokenizer) -> None:
    messy = tok.code_prompt(" [Stts]你[spk_emb]好[empty_spk] \n")
    assert torch.equal(messy.input_ids, tok.code_prompt("你好").input_ids)


def test_code_prompt_without_speaker_or_speed(tok: Tokenizer) -> None:
    p = tok.code_prompt("你好", prompt="")
    assert p.input_ids[:, 0].tolist() == [STTS, EMPTY_SPK] + tok.encode("你好") + [PTTS]
    assert p.spk_emb is None and p.spk_positions == ()
    assert bool(p.text_mask.all())


def test_code_prompt_accepts_strings(tok: Tokenizer) -> None:
    torch.manual_seed(0)
    spk = sample_random_speaker()
    smp = torch.randint(0, 625, (4, 5))
    a = tok.code_prompt("你好", spk_emb=spk, spk_smp=encode_prompt(smp))
    b = tok.code_prompt("你好", spk_emb=decode_spk_emb(spk), spk_smp=smp)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.spk_emb, b.spk_emb)


def test_code_prompt_rejects_bad_inputs(tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="spk_smp"):
        tok.code_prompt("你好", spk_smp=torch.zeros(3, 5, dtype=torch.int64))
    with pytest.raises(ValueError, match="speaker"):
        tok.code_prompt("你好", spk_emb="not a speaker")
    with pytest.raises(ValueError, match="text"):
        tok.code_prompt(["你好"])


def test_refine_prompt_layout(tok: Tokenizer) -> None:
    p = tok.refine_prompt("你好", "[oral_2][laugh_0][break_6]")
    expected = [SBREAK] + tok.encode("你好") + [PBREAK, ORAL_0 + 2, LAUGH_0, BREAK_0 + 6]
    assert p.input_ids[:, 0].tolist() == expected
    assert bool(p.text_mask.all()) and p.spk_emb is None


def test_refined_text_drops_break_and_later_ids(tok: Tokenizer) -> None:
    ids = [SBREAK, 872, 1962, BREAK_0, 8024, UV_BREAK, LAUGH_0, 8701, ORAL_0 + 2, SPEED_0 + 2, LAUGH, PBREAK]
    # Recorded from chattts 0.2.5 (tokenizer.decode of ids < break_0) for these ids.
    assert tok.refined_text(ids) == "[Sbreak] 你 好 ， [uv_break] hello [laugh] [Pbreak]"
    assert tok.refined_text(torch.tensor(ids)) == tok.refined_text(ids)


def upstream_layout(texts: list[list[int]], codes: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """Upstream's batch layout written out directly: left-pad texts to the longest, then append the shared codes."""
    width = max(len(t) for t in texts)
    p = 0 if codes is None else codes.shape[1]
    ids = torch.zeros(len(texts), width + p, 4, dtype=torch.int64)
    att = torch.zeros(len(texts), width + p, dtype=torch.int64)
    for n, t in enumerate(texts):
        for k, token in enumerate(t):
            ids[n, width - len(t) + k, :] = token
            att[n, width - len(t) + k] = 1
        if p:
            ids[n, width:] = codes.t()
            att[n, width:] = 1
    text_mask = att.bool()
    text_mask[:, width:] = False
    return ids, att, text_mask


@pytest.mark.parametrize("with_codes", [False, True])
def test_pad_left_matches_upstream_layout(tok: Tokenizer, with_codes: bool) -> None:
    texts = ["你好", "今天天气真好，我们出去玩吧", "短"]
    codes = torch.randint(0, 625, (4, 6)) if with_codes else None
    prompts = [tok.code_prompt(t, spk_smp=codes) for t in texts]
    bare = [tok.code_prompt(t).input_ids[:, 0].tolist() for t in texts]
    got = pad_left(prompts)
    want = upstream_layout(bare, codes)
    assert [g.dtype for g in got] == [torch.int64, torch.int64, torch.bool]
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_pad_left_rejects_empty() -> None:
    with pytest.raises(ValueError, match="prompts"):
        pad_left([])
