"""Packed weights on 2 MiB pages: the kernels' weight layouts copied into memory Linux may back with transparent huge
pages (an anonymous private mapping marked MADV_HUGEPAGE), the weights of one model next to each other.

Why: a decode step streams every weight once. With 4 KiB pages that is one TLB miss per 64 cache lines, and in a
virtual machine each miss walks the guest's and the host's page tables; on a 2-vCPU Zen 4 guest a pure streaming
read of a step's int8 weights ran at about half the rate on 4 KiB pages that it reached on 2 MiB pages
(docs/performance.md, "The bandwidth ceiling of one stream"). torch's allocator asks for huge pages only when the
process starts with THP_MEM_ALLOC_ENABLE=1; the hosts' default (`madvise`) gives none otherwise.

Tensors are cut from arenas of ARENA_BYTES (a larger tensor gets its own), 64-byte aligned; an arena is unmapped
when no tensor cut from it is alive. Where madvise is not available the copy is a plain contiguous tensor.
"""
from __future__ import annotations

import mmap
import threading

import torch

HUGE_PAGE = 2 << 20
ARENA_BYTES = 64 << 20
ALIGN = 64


class _Arena:
    def __init__(self, size: int) -> None:
        self.map = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        view = memoryview(self.map)
        start = -_address(view) % HUGE_PAGE  # the first 2 MiB boundary: pages before it are never touched
        self.map.madvise(mmap.MADV_HUGEPAGE, start, size)
        self.view, self.used, self.size = view[start:start + size], 0, size

    def take(self, nbytes: int) -> memoryview | None:
        if self.used + nbytes > self.size:
            return None
        piece = self.view[self.used:self.used + nbytes]
        self.used += -(-nbytes // ALIGN) * ALIGN
        return piece


def _address(view: memoryview) -> int:
    return torch.frombuffer(view, dtype=torch.uint8).data_ptr() if len(view) else 0


_lock = threading.Lock()
_arena: _Arena | None = None


def on_huge_pages(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of `tensor` (CPU) in arena memory that Linux backs with 2 MiB pages where it can."""
    global _arena
    nbytes = tensor.numel() * tensor.element_size()
    if not hasattr(mmap, "MADV_HUGEPAGE") or tensor.device.type != "cpu" or nbytes == 0:
        return tensor.contiguous()
    with _lock:
        piece = _arena.take(nbytes) if _arena is not None else None
        if piece is None:
            arena = _Arena(max(ARENA_BYTES, -(-nbytes // HUGE_PAGE) * HUGE_PAGE))
            if nbytes < ARENA_BYTES:
                _arena = arena
            piece = arena.take(nbytes)
        assert piece is not None
    out = torch.frombuffer(piece, dtype=tensor.dtype).view(tensor.shape)
    out.copy_(tensor)
    return out
