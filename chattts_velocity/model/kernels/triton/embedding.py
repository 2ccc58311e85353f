"""Model stage, CUDA backend: a steady decode step's inputs in one launch: the code embeddings and the paged metadata.

In: the step's ids [B, num_vq] (the codes the last step sampled), the num_vq code tables concatenated [num_vq * V, H],
positions [B] and block tables [B, n]. Out: embeddings [B, H] (the layers' dtype), the pool slots [B] the new
positions write their K/V to and the context lengths [B] they attend over (model/attention.DecodeMetadata).
The embedding sums the num_vq rows as Embed.embed_codes does, ((e0 + e1) + e2) + e3 in fp32, rounded once to the
tables' dtype, then to the layers'.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from chattts_velocity.model.kernels.triton.rounding import to_dtype

EAGER = {"enable_fp_fusion": False}
HIDDEN_TILE = 1024  # embedding columns per loop step


@triton.jit(do_not_specialize=["history_stride"])  # the penalty window's width changes with requests: one variant
def _decode_inputs_kernel(ids_ptr, table_ptr, positions_ptr, tables_ptr, embeds_ptr, slots_ptr, context_ptr,
                          history_ptr, ring_ptr, table_stride, history_stride, vocab, hidden, block_size,
                          NUM_VQ: tl.constexpr, BLOCK: tl.constexpr, RING: tl.constexpr):
    # one program per sequence
    seq = tl.program_id(0).to(tl.int64)
    if RING:  # sampling row seq * NUM_VQ + q: its history column ring[row] takes the id it embeds
        for q in tl.static_range(NUM_VQ):
            row = seq * NUM_VQ + q
            column = tl.load(ring_ptr + row)
            tl.store(history_ptr + row * history_stride + column, tl.load(ids_ptr + row))
    position = tl.load(positions_ptr + seq)
    block = tl.load(tables_ptr + seq * table_stride + position // block_size)
    tl.store(slots_ptr + seq, block * block_size + position % block_size)
    tl.store(context_ptr + seq, position + 1)
    for start in range(0, hidden, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        ok = cols < hidden
        first = tl.load(ids_ptr + seq * NUM_VQ)
        acc = tl.load(table_ptr + first * hidden + cols, mask=ok, other=0.0).to(tl.float32)
        for q in tl.static_range(1, NUM_VQ):
            row = tl.load(ids_ptr + seq * NUM_VQ + q) + q * vocab
            acc += tl.load(table_ptr + row * hidden + cols, mask=ok, other=0.0).to(tl.float32)
        summed = to_dtype(acc, table_ptr.dtype.element_ty)
        tl.store(embeds_ptr + seq * hidden + cols, to_dtype(summed, embeds_ptr.dtype.element_ty), mask=ok)


def decode_inputs(ids: torch.Tensor, code_table: torch.Tensor, positions: torch.Tensor, block_tables: torch.Tensor,
                  block_size: int, dtype: torch.dtype, ring: tuple[torch.Tensor, torch.Tensor] | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids [B, num_vq] int64, code_table [num_vq * V, H], positions [B] int64, block_tables [B, n] int64 ->
    (embeddings [B, H] in dtype, slots [B] int64, context_lens [B] int64). ring (history [B * num_vq, W] int64,
    columns [B * num_vq] int64): each sampling row's id is also written to history[row, columns[row]] (the
    repetition penalty's window of a step launched before the host has the id)."""
    num, num_vq = ids.shape
    if code_table.dim() != 2 or code_table.shape[0] % num_vq or positions.shape != (num,) \
            or block_tables.dim() != 2 or block_tables.shape[0] != num:
        raise ValueError(f"decode_inputs: need ids [B, num_vq], code_table [num_vq * V, H], positions [B] and "
                         f"block_tables [B, n], got {tuple(ids.shape)}, {tuple(code_table.shape)}, "
                         f"{tuple(positions.shape)}, {tuple(block_tables.shape)}")
    hidden = code_table.shape[1]
    embeds = torch.empty(num, hidden, dtype=dtype, device=ids.device)
    slots, context = (torch.empty(num, dtype=torch.int64, device=ids.device) for _ in range(2))
    history, columns = ring if ring is not None else (slots, slots)  # without a ring: never read
    if ring is not None and (history.shape[0] != num * num_vq or columns.shape != (num * num_vq,)
                             or history.stride(1) != 1):
        raise ValueError(f"decode_inputs: ring needs history [{num * num_vq}, W] (unit column stride) and columns "
                         f"[{num * num_vq}], got {tuple(history.shape)}, {tuple(columns.shape)}")
    _decode_inputs_kernel[(num,)](ids.contiguous(), code_table.contiguous(), positions.contiguous(), block_tables,
                                  embeds, slots, context, history, columns, block_tables.stride(0),
                                  history.stride(0), code_table.shape[0] // num_vq, hidden, block_size,
                                  NUM_VQ=num_vq, BLOCK=min(HIDDEN_TILE, triton.next_power_of_2(hidden)),
                                  RING=ring is not None, num_warps=4, **EAGER)
    return embeds, slots, context
