"""BlockManager: block boundaries, ref counts, speaker-aware prefix cache, last position recomputed."""
from __future__ import annotations

import pytest
import torch
from fakes import make_prompt

from chattts_velocity.engine.sched.block_manager import BlockManager
from chattts_velocity.engine.sched.sequence import Sequence
from chattts_velocity.schema import Prompt, SamplingParams

BS = 4


def _seq(prompt: Prompt, name: str = "s") -> Sequence:
    return Sequence(name, prompt, SamplingParams(seed=0))


def _computed(bm: BlockManager, seq: Sequence) -> None:
    """Pretend the model computed every position but the last, as after a prefill."""
    seq.num_computed_tokens = len(seq) - 1
    bm.cache_computed_blocks(seq)


def _decode(bm: BlockManager, seq: Sequence, token: tuple[int, ...] = (1, 2, 3, 4)) -> None:
    """One decode step: compute the pending position, append a token, reserve its slot."""
    seq.num_computed_tokens = len(seq)
    bm.cache_computed_blocks(seq)
    seq.append_token(token, None)
    assert bm.can_append(seq)
    bm.append_slot(seq)


@pytest.mark.parametrize("length,blocks", [(1, 1), (BS, 1), (BS + 1, 2), (3 * BS, 3)])
def test_allocate_covers_every_position(length, blocks):
    bm = BlockManager(8, BS)
    seq = _seq(make_prompt(length))
    assert bm.can_allocate(seq)
    bm.allocate(seq)
    assert len(seq.block_table) == blocks and len(set(seq.block_table)) == blocks
    assert bm.num_used_blocks == blocks and bm.num_free_blocks == 8 - blocks
    assert bm.usage == pytest.approx(blocks / 8)
    bm.free(seq)
    assert bm.num_used_blocks == 0 and seq.block_table == [] and seq.num_computed_tokens == 0


def test_append_slot_adds_a_block_only_when_crossing_a_boundary():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    seq = _seq(make_prompt(3))
    bm.allocate(seq)
    sizes = []
    for _ in range(6):
        _decode(bm, seq)
        sizes.append(len(seq.block_table))
    # len goes 4, 5, 6, 7, 8, 9 -> blocks 1, 2, 2, 2, 2, 3
    assert sizes == [1, 2, 2, 2, 2, 3]
    assert seq.num_blocks(BS) == len(seq.block_table)


def test_can_allocate_and_can_append_respect_the_pool():
    bm = BlockManager(3, BS, enable_prefix_caching=False)
    big, small = _seq(make_prompt(2 * BS), "big"), _seq(make_prompt(BS, seed=1), "small")
    bm.allocate(big)
    assert bm.can_allocate(small)
    bm.allocate(small)
    assert not bm.can_allocate(_seq(make_prompt(1, seed=2)))
    _computed(bm, small)
    small.num_computed_tokens = len(small)
    small.append_token((1, 2, 3, 4), None)  # position BS needs a 4th block
    assert not bm.can_append(small)
    with pytest.raises(RuntimeError):
        bm.append_slot(small)


def test_identical_prompts_share_full_blocks_with_ref_counts():
    bm = BlockManager(16, BS)
    a, b = _seq(make_prompt(10), "a"), _seq(make_prompt(10), "b")
    bm.allocate(a)
    _computed(bm, a)
    bm.allocate(b)
    assert b.num_cached_tokens == 2 * BS and b.num_computed_tokens == 2 * BS
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [bm.ref_counts[x] for x in a.block_table] == [2, 2, 1]
    assert bm.num_used_blocks == 4
    bm.free(a)
    assert [bm.ref_counts[x] for x in b.block_table] == [1, 1, 1] and bm.num_used_blocks == 3
    bm.free(b)
    assert bm.num_used_blocks == 0


def test_blocks_become_findable_only_after_their_kv_is_computed():
    bm = BlockManager(16, BS)
    a, b = _seq(make_prompt(10), "a"), _seq(make_prompt(10), "b")
    bm.allocate(a)
    a.num_computed_tokens = BS  # a chunked prefill wrote only the first block so far
    bm.cache_computed_blocks(a)
    bm.allocate(b)
    assert b.num_cached_tokens == BS and b.block_table[0] == a.block_table[0]


def test_last_position_is_always_recomputed():
    bm = BlockManager(16, BS)
    a = _seq(make_prompt(2 * BS), "a")
    bm.allocate(a)
    a.num_computed_tokens = len(a)  # even if every block of a is cached
    bm.cache_computed_blocks(a)
    b = _seq(make_prompt(2 * BS), "b")
    bm.allocate(b)
    assert b.num_cached_tokens == BS and b.num_computed_tokens == len(b) - BS
    assert b.block_table[1] != a.block_table[1]  # nobody writes into a shared block
    one = _seq(make_prompt(1), "one")
    bm.allocate(one)
    assert one.num_cached_tokens == 0


def _hits(first: Prompt, second: Prompt, caching: bool = True) -> int:
    bm = BlockManager(32, BS, enable_prefix_caching=caching)
    a, b = _seq(first, "a"), _seq(second, "b")
    bm.allocate(a)
    _computed(bm, a)
    bm.allocate(b)
    return b.num_cached_tokens


def test_no_hit_when_only_the_speaker_vector_differs():
    spk = torch.randn(8)
    assert _hits(make_prompt(12, spk=spk), make_prompt(12, spk=spk.clone())) == 2 * BS
    assert _hits(make_prompt(12, spk=spk), make_prompt(12, spk=spk * 1.001)) == 0
    assert _hits(make_prompt(12, spk=spk), make_prompt(12)) == 0


def test_no_hit_past_a_differing_audio_prompt_code_or_text_mask():
    first = make_prompt(16, num_audio=10)  # audio rows 6..15
    second = make_prompt(16, num_audio=10)
    second.input_ids[9, 3] = (second.input_ids[9, 3] + 1) % 625  # one code, channel 3, block 2
    assert _hits(first, second) == 2 * BS
    third = make_prompt(16, num_audio=10)
    third.text_mask[5] = False  # same ids, embedded as codes instead of text, block 1
    assert _hits(first, third) == BS


def test_no_hits_without_prefix_caching():
    assert _hits(make_prompt(12), make_prompt(12), caching=False) == 0


def test_freed_blocks_stay_findable_until_reused():
    bm = BlockManager(4, BS)
    a = _seq(make_prompt(9), "a")
    bm.allocate(a)
    _computed(bm, a)
    cached = a.block_table[:2]
    bm.free(a)
    again = _seq(make_prompt(9), "again")
    assert bm.can_allocate(again)
    bm.allocate(again)
    assert again.block_table[:2] == cached and again.num_cached_tokens == 2 * BS
    bm.free(again)
    filler = _seq(make_prompt(4 * BS, seed=5), "filler")  # takes the whole pool: evicts every hash
    bm.allocate(filler)
    bm.free(filler)
    late = _seq(make_prompt(9), "late")
    bm.allocate(late)
    assert late.num_cached_tokens == 0


def test_can_allocate_counts_cached_blocks_that_are_free():
    bm = BlockManager(3, BS)
    a = _seq(make_prompt(9), "a")  # 3 blocks, 2 cacheable
    bm.allocate(a)
    _computed(bm, a)
    bm.free(a)
    b = _seq(make_prompt(9), "b")
    assert bm.can_allocate(b)  # 2 revived + 1 fresh = the 3 free blocks
    bm.allocate(b)
    assert bm.num_free_blocks == 0 and b.num_cached_tokens == 2 * BS


def test_generated_blocks_are_cached_so_recompute_hits():
    bm = BlockManager(16, BS)
    seq = _seq(make_prompt(3))
    bm.allocate(seq)
    for k in range(7):  # len 3 -> 10; positions 0..8 computed
        _decode(bm, seq, (k, k, k, k))
    table = list(seq.block_table)
    bm.free(seq)  # preempted
    bm.allocate(seq)
    assert seq.block_table[:2] == table[:2] and seq.num_computed_tokens == 2 * BS


def test_fork_shares_full_computed_blocks():
    bm = BlockManager(16, BS, enable_prefix_caching=False)
    parent = _seq(make_prompt(10), "p")
    bm.allocate(parent)
    parent.num_computed_tokens = 9
    child = _seq(make_prompt(10), "c")
    bm.fork(parent, child)
    assert child.block_table[:2] == parent.block_table[:2] and child.num_computed_tokens == 2 * BS
    assert [bm.ref_counts[x] for x in parent.block_table] == [2, 2, 1]
    bm.free(parent)
    bm.free(child)
    assert bm.num_used_blocks == 0


def test_bad_pool_size_is_a_value_error():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0, BS)


def test_blocks_kept_for_a_seat_group_go_to_its_sequences_only():
    bm = BlockManager(10, BS)
    beam, other = _seq(make_prompt(BS + 1), "beam#0"), _seq(make_prompt(BS, seed=1), "other")
    beam.seat_group = ("beam", 2)
    assert not bm.reserve("beam", 11) and not bm.is_reserved("beam")  # more than the pool: nothing kept
    assert bm.reserve("beam", 6)
    assert bm.num_unreserved_blocks == 4 and bm.available_to(beam) == 10 and bm.available_to(other) == 4
    bm.allocate(beam)  # 2 blocks, charged to what the group keeps
    assert bm.available_to(beam) == 8 and bm.available_to(other) == 4
    grown = _seq(make_prompt(5 * BS, seed=2), "grown")
    assert not bm.can_allocate(grown)  # 5 blocks are free for outsiders only if the group gave them back
    bm.free(beam)  # its blocks come back to what it keeps (never past what it reserved)
    assert bm.available_to(beam) == 10 and bm.num_unreserved_blocks == 4
    bm.unreserve("beam")
    assert bm.num_unreserved_blocks == 10 and bm.can_allocate(grown)
