"""kernels.pages: packed weights copied into arenas marked for 2 MiB pages, values and layout unchanged."""
from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import pytest
import torch

from chattts_velocity.model import kernels
from chattts_velocity.model.kernels import pages


def test_a_copy_on_huge_pages_keeps_values_shape_and_dtype_and_is_aligned() -> None:
    for tensor in (torch.randn(40, 96).to(torch.bfloat16), torch.randint(-127, 128, (8, 3, 5), dtype=torch.int8),
                   torch.randn(7, 33).t()):  # non-contiguous input: copied in its logical order
        copy = pages.on_huge_pages(tensor)
        assert copy.is_contiguous() and copy.dtype == tensor.dtype and torch.equal(copy, tensor)
        assert copy.data_ptr() % pages.ALIGN == 0


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE on this OS")
def test_small_weights_share_an_arena_and_a_large_one_gets_its_own() -> None:
    first, second = (pages.on_huge_pages(torch.ones(1000, dtype=torch.int8)) for _ in range(2))
    assert second.data_ptr() - first.data_ptr() == 1024  # 64-byte aligned, next to each other
    large = pages.on_huge_pages(torch.arange(pages.ARENA_BYTES // 4 + 16, dtype=torch.int32))
    assert large.data_ptr() % pages.HUGE_PAGE == 0 and int(large[-1]) == pages.ARENA_BYTES // 4 + 15
    third = pages.on_huge_pages(torch.ones(1000, dtype=torch.int8))
    assert third.data_ptr() - second.data_ptr() == 1024  # the large one did not replace the shared arena


def advised_huge(address: int) -> bool:
    """Whether the mapping holding `address` carries MADV_HUGEPAGE ("hg" among its VmFlags in /proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text(encoding="ascii", errors="replace").splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(part, 16) for part in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return "hg" in line.split()
    return False


@pytest.mark.skipif(not Path("/proc/self/smaps").exists() or not hasattr(mmap, "MADV_HUGEPAGE"),
                    reason="needs Linux's /proc/self/smaps and MADV_HUGEPAGE")
def test_the_kernel_layouts_live_on_huge_page_arenas_and_round_trip() -> None:
    weight = torch.randn(64, 96).to(torch.bfloat16)
    tiles, panels = kernels.to_tiles(weight, 32), kernels.to_panels(weight)
    q, scales = kernels.quantize_int4(weight.float())
    packed, packed_scales = kernels.to_int4_tiles(q, scales)
    assert torch.equal(kernels.from_tiles(tiles), weight) and torch.equal(kernels.from_panels(panels), weight)
    assert torch.equal(kernels.from_int4_tiles(packed, packed_scales)[0], q)
    assert all(advised_huge(t.data_ptr()) for t in (tiles, panels, packed))
    # The probe can say no: a fresh anonymous mapping nobody advised (heap memory is no control, since malloc
    # tunables or the allocator may advise it too).
    plain = mmap.mmap(-1, 4 * pages.HUGE_PAGE)
    try:
        marker = ctypes.c_char.from_buffer(plain)
        assert not advised_huge(ctypes.addressof(marker))
        del marker
    finally:
        plain.close()
