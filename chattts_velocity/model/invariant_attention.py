"""One sequence's attention whose bits depend on nothing but that sequence (the torch backend on a CPU).

A row's output must not change with the rows around it: other sequences (batching), the other rows of its own
chunk (a prompt computed whole, after a prefix-cache hit, or split by the step's token budget), or the step
kind (a generated position decoded, or recomputed after preemption). BLAS picks its kernel, and so its
summation order, from a GEMM's shape, and torch's reductions from their lengths, so every sum here runs at
shapes that are fixed whatever the chunk:

- prompt rows (positions < the prompt length): tiles of ROW_TILE query rows against chunks of KEY_CHUNK keys,
  both aligned to the context, each a GEMM of one fixed shape; an exact max, then per chunk a fixed-length sum,
  and the chunks added in order by a sequential cumsum (trailing chunks past a row's position add exact zeros);
- generated rows: a GEMV over exactly the row's own context (positions 0..p), as a decode step computes it; a
  recomputed run of generated rows computes them one at a time the same way.
"""
from __future__ import annotations

import torch

ROW_TILE = 16  # query rows of every score / value GEMM
KEY_CHUNK = 64  # keys of every score / value GEMM


def attend_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prompt_len: int, scale: float,
                    ) -> torch.Tensor:
    """q [1, heads, q_len, d] at positions k_len - q_len ..; k/v [1, heads, k_len, d] -> [1, heads, q_len, d]."""
    q_len, k_len = q.shape[2], k.shape[2]
    first = k_len - q_len
    split = min(max(prompt_len - first, 0), q_len)  # rows [0, split) are prompt rows
    parts = []
    if split:
        end = first + split
        parts.append(attend_prompt_rows(q[:, :, :split], k[:, :, :end], v[:, :, :end], scale))
    for row in range(split, q_len):
        end = first + row + 1
        parts.append(attend_generated_row(q[:, :, row : row + 1], k[:, :, :end], v[:, :, :end], scale))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def attend_generated_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    # q [1, heads, 1, d], k/v [1, heads, p + 1, d] (the row's whole context): plain GEMVs and a softmax, in fp32.
    # SDPA's CPU kernel splits a long context across threads, so its sums would depend on the thread count.
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    return (scores.softmax(-1) @ v.float()).to(q.dtype)


def attend_prompt_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of the last R context positions: q [1, heads, R, d], k/v [1, heads, L, d], in fp32."""
    heads, rows, d = q.shape[1:]
    length = k.shape[2]
    tiles, chunks = -(-rows // ROW_TILE), -(-length // KEY_CHUNK)
    qp = q.new_zeros(heads, tiles * ROW_TILE, d, dtype=torch.float32)
    qp[:, :rows] = q[0]
    kp, vp = (t.new_zeros(heads, chunks * KEY_CHUNK, d, dtype=torch.float32) for t in (k, v))
    kp[:, :length], vp[:, :length] = k[0], v[0]
    kc, vc = kp.view(heads, 1, chunks, KEY_CHUNK, d), vp.view(heads, 1, chunks, KEY_CHUNK, d)
    scores = qp.view(heads, tiles, 1, ROW_TILE, d) @ kc.transpose(-1, -2)  # [heads, tiles, chunks, ROW_TILE, KEY_CHUNK]
    # padding rows take the last row's position (their outputs are dropped); padding keys sit past every row
    position = (length - rows + torch.arange(tiles * ROW_TILE)).clamp(max=length - 1).view(tiles, 1, ROW_TILE, 1)
    key = torch.arange(chunks * KEY_CHUNK).view(1, chunks, 1, KEY_CHUNK)
    scores = (scores * scale).masked_fill(key > position, float("-inf"))
    weights = torch.exp(scores - scores.amax(dim=(2, 4), keepdim=True))  # masked -> exact 0
    values = (weights @ vc).cumsum(2)[:, :, -1]  # [heads, tiles, ROW_TILE, d]: chunk sums added in order
    total = weights.sum(-1).cumsum(2)[:, :, -1]  # [heads, tiles, ROW_TILE]
    out = (values / total.unsqueeze(-1)).view(heads, tiles * ROW_TILE, d)[:, :rows]
    return out.unsqueeze(0).to(q.dtype)
