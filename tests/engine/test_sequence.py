"""Sequence bookkeeping: positions, rows fed to the model, penalty window, hidden alignment, output."""
from __future__ import annotations

import pytest
import torch
from fakes import make_prompt, recent_tokens, snapshot

from chattts_velocity.engine.sched.sequence import Sequence, SequenceStatus
from chattts_velocity.schema import SamplingParams


def _seq(prompt_len: int = 5, mode: str = "code", **params) -> Sequence:
    prompt = make_prompt(prompt_len, num_audio=min(2, prompt_len - 1))
    return Sequence("r", prompt, SamplingParams(mode=mode, **params))


def test_len_counts_positions_not_codes():
    seq = _seq(5)
    assert len(seq) == 5 and seq.num_rows == 4
    seq.append_token((1, 2, 3, 4), None)
    seq.append_token((5, 6, 7, 8), None)
    assert len(seq) == 7 and seq.num_generated == 2


@pytest.mark.parametrize("length,block_size,expected",
                         [(1, 4, 1), (4, 4, 1), (5, 4, 2), (8, 4, 2), (9, 4, 3)])
def test_num_blocks_at_boundaries(length, block_size, expected):
    assert _seq(length).num_blocks(block_size) == expected


def test_rows_cover_prompt_then_generated_code_tokens():
    seq = _seq(5)
    seq.append_token((1, 2, 3, 4), None)
    seq.append_token((5, 6, 7, 8), None)
    ids, mask = seq.rows(0, len(seq))
    assert torch.equal(ids[:5], seq.prompt.input_ids) and torch.equal(mask[:5], seq.prompt.text_mask)
    assert ids[5:].tolist() == [[1, 2, 3, 4], [5, 6, 7, 8]] and mask[5:].tolist() == [False, False]
    sub_ids, sub_mask = seq.rows(3, 6)  # straddles the prompt/generated border
    assert torch.equal(sub_ids, ids[3:6]) and torch.equal(sub_mask, mask[3:6])
    assert seq.last_row == (5, 6, 7, 8)


def test_text_mode_tokens_repeat_over_channels_with_text_mask():
    seq = _seq(3, mode="text", eos_token_id=21136)
    assert seq.num_rows == 1
    seq.append_token((77,), None)
    ids, mask = seq.rows(3, 4)
    assert ids.tolist() == [[77, 77, 77, 77]] and mask.tolist() == [True]
    assert seq.last_row == (77, 77, 77, 77)
    with pytest.raises(ValueError):
        seq.append_token((1, 2, 3, 4), None)


def test_recent_tokens_window_excludes_prompt_oldest_first():
    seq = _seq(5)
    assert recent_tokens(seq, 16).shape == (4, 0)
    for k in range(20):
        seq.append_token((k, k + 100, k + 200, k + 300), None)
    recent = recent_tokens(seq, 16)
    assert recent.shape == (4, 16)
    assert recent[0].tolist() == list(range(4, 20)) and recent[3].tolist() == list(range(304, 320))
    assert recent_tokens(seq, 0).shape == (4, 0)


def test_hidden_states_align_with_tokens_across_buffer_growth():
    seq = _seq(5)
    expected = [torch.randn(8) for _ in range(40)]
    for k, h in enumerate(expected):
        seq.append_token((k,) * 4, h)
    assert torch.equal(seq.hidden_states(), torch.stack(expected))
    out = snapshot(seq)
    assert out.token_ids.shape == (40, 4) and out.token_ids[:, 0].tolist() == list(range(40))
    assert torch.equal(out.hidden, torch.stack(expected)) and out.hidden.dtype == torch.float32


def test_output_without_hidden_and_when_empty():
    seq = _seq(5, return_hidden=False)
    empty = snapshot(seq)
    assert empty.token_ids.shape == (0, 4) and empty.hidden is None and not empty.finished
    seq.append_token((1, 2, 3, 4), torch.randn(8))
    assert snapshot(seq).hidden is None
    seq.status = SequenceStatus.FINISHED_LENGTH
    out = snapshot(seq)
    assert out.finished and out.finish_reason == "length"


def test_finish_reasons_match_schema():
    seq = _seq()
    assert seq.finish_reason is None and not seq.is_finished
    for status, reason in [(SequenceStatus.FINISHED_EOS, "eos"), (SequenceStatus.FINISHED_ABORTED, "abort")]:
        seq.status = status
        assert seq.finish_reason == reason and seq.is_finished


def test_cache_salt_depends_on_speaker_vector_and_position():
    spk = torch.randn(8)
    a = Sequence("a", make_prompt(6, spk=spk), SamplingParams())
    b = Sequence("b", make_prompt(6, spk=spk.clone()), SamplingParams())
    c = Sequence("c", make_prompt(6, spk=spk + 1e-3), SamplingParams())
    d = Sequence("d", make_prompt(6), SamplingParams())
    assert a.cache_salt == b.cache_salt
    assert len({a.cache_salt, c.cache_salt, d.cache_salt}) == 3
    moved = make_prompt(6, spk=spk)
    moved.spk_positions = (2,)
    assert Sequence("e", moved, SamplingParams()).cache_salt != a.cache_salt
