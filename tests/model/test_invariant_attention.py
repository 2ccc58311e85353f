"""invariant_attention: a row's bits depend on its own sequence only: not on how its prompt is chunked, nor on
whether a generated position is decoded or recomputed; and the values are attention's."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity.model.invariant_attention import KEY_CHUNK, ROW_TILE, attend_sequence

HEADS, D = 3, 16


def _context(length: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, HEADS, length, D, generator=g) for _ in range(3))  # type: ignore[return-value]


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    # the last q_len positions attending causally, in float64
    q_len, k_len = q.shape[2], k.shape[2]
    scores = (q.double() @ k.double().transpose(-1, -2)) * D ** -0.5
    visible = torch.arange(k_len)[None, :] <= (k_len - q_len + torch.arange(q_len))[:, None]
    return scores.masked_fill(~visible, float("-inf")).softmax(-1) @ v.double()


@pytest.mark.parametrize("length", [1, 5, ROW_TILE + 3, KEY_CHUNK + 7, 2 * KEY_CHUNK + ROW_TILE])
def test_prompt_rows_are_attention(length: int) -> None:
    q, k, v = _context(length)
    out = attend_sequence(q, k, v, prompt_len=length, scale=D ** -0.5)
    assert torch.allclose(out.double(), _dense(q, k, v), atol=1e-5)


def test_a_prompt_row_has_the_same_bits_in_every_chunk_that_computes_it() -> None:
    length = KEY_CHUNK + 2 * ROW_TILE + 5
    q, k, v = _context(length, seed=1)
    whole = attend_sequence(q, k, v, prompt_len=length, scale=D ** -0.5)[0]
    for start in range(length):  # a chunk from `start` to `end`, as after a prefix hit or a budget split
        for end in {start + 1, min(start + 7, length), length}:
            part = attend_sequence(q[:, :, start:end], k[:, :, :end], v[:, :, :end], prompt_len=length,
                                   scale=D ** -0.5)[0]
            assert torch.equal(part, whole[:, start:end]), (start, end)


def test_recomputed_generated_rows_are_the_bits_their_decode_steps_made() -> None:
    prompt, length = 9, 40
    q, k, v = _context(length, seed=2)
    decoded = [attend_sequence(q[:, :, p : p + 1], k[:, :, : p + 1], v[:, :, : p + 1], prompt_len=prompt,
                               scale=D ** -0.5)[0, :, 0] for p in range(prompt, length)]
    recomputed = attend_sequence(q, k, v, prompt_len=prompt, scale=D ** -0.5)[0]  # prompt + generated, one chunk
    assert torch.equal(recomputed[:, prompt:], torch.stack(decoded, dim=1))
    assert torch.allclose(recomputed.double(), _dense(q, k, v)[0], atol=1e-5)


def test_bf16_rows_come_back_in_bf16_with_fp32_sums() -> None:
    q, k, v = (t.bfloat16() for t in _context(30, seed=3))
    out = attend_sequence(q, k, v, prompt_len=30, scale=D ** -0.5)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.double(), _dense(q, k, v), atol=2e-2)
