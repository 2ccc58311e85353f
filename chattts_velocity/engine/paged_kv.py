"""Engine stage: the KV pool as the decode backends see it, and the padded host-side inputs of decode steps.

In: positions and block tables of a decode step. Out: DecodeMetadata tensors (or host lists for CUDA graph buffers).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from chattts_velocity.model import DecodeMetadata
from chattts_velocity.model.llama import KVPair


@dataclass(frozen=True)
class PagedKV:
    """The engine's KV pool as the backends see it."""

    pairs: list[KVPair]  # per layer (K, V), each [num_blocks + 1, block_size, heads, head_dim (+ 4 if int8)]
    block_size: int
    pad_block: int  # the extra last block, never handed out: write target of padding rows in compiled steps
    device: torch.device

    def decode_metadata(self, positions: list[int], tables: list[list[int]], min_size: int = 1,
                        ) -> tuple[torch.Tensor, DecodeMetadata]:
        """positions [B] and DecodeMetadata; batch and table width padded to min_size with padding-block rows."""
        width = max(min_size, max(len(t) for t in tables))
        positions, slots, tables = self.decode_rows(positions, tables, max(min_size, len(positions)), width)
        as_tensor = lambda values: torch.tensor(values, dtype=torch.int64, device=self.device)
        pos = as_tensor(positions)
        return pos, DecodeMetadata(as_tensor(slots), as_tensor(tables), pos + 1)

    def decode_rows(self, positions: list[int], tables: list[list[int]], batch: int, width: int,
                    ) -> tuple[list[int], list[int], list[list[int]]]:
        """positions [batch], slots [batch] and tables [batch][width] of a decode step, as host lists.

        Real rows come first, their tables padded with block 0 (never read: past the context); the padding rows
        sit at position 0 of the pad block, so they write their K/V there and attend only to it.
        """
        bs, num_pad = self.block_size, batch - len(positions)
        tables = [t + [0] * (width - len(t)) for t in tables] + [[self.pad_block] * width] * num_pad
        slots = [t[p // bs] * bs + p % bs for t, p in zip(tables, positions)] + [self.pad_block * bs] * num_pad
        return positions + [0] * num_pad, slots, tables
