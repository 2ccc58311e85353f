"""The compiled tile kernels keep their weight prefetches.

GCC drops a `__builtin_prefetch` it reaches through a wrapper that is not inlined (it deems the builtin free of side
effects), silently: the results stay bit-for-bit the same, only the weights' streaming slows down. So the check
reads the built library's machine code: every tile kernel (`tile_rows*`, one symbol per row count) issues at least
one prefetch instruction.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from chattts_velocity.model import kernels
from chattts_velocity.model.kernels.build import build_library

SYMBOL = re.compile(r"^[0-9a-f]+ <(.*)>:$")


def tile_kernels(library: Path) -> dict[str, int]:
    """Each tile kernel's symbol (demangled) -> the prefetch instructions in its body."""
    listing = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", str(library)], capture_output=True,
                             text=True, check=True).stdout
    counts: dict[str, int] = {}
    name: str | None = None
    for line in listing.splitlines():
        if match := SYMBOL.match(line):
            symbol = match.group(1)
            name = symbol if "tile_rows" in symbol and ".cold" not in symbol else None
            if name is not None:
                counts[name] = 0
        elif name is not None and "prefetch" in line:
            counts[name] += 1
    return counts


def check_library(which: str) -> None:
    counts = tile_kernels(build_library(which, kernels.ISAS[which]))
    assert len(counts) >= 8, f"expected the tile kernels as symbols of the {which} library, found {sorted(counts)}"
    assert [name for name, n in counts.items() if n == 0] == []


@pytest.mark.skipif(shutil.which("objdump") is None, reason="binutils' objdump reads the machine code")
def test_the_tile_kernels_in_use_prefetch_their_weights() -> None:
    which = kernels.isa()
    if which is None or which == "neon":
        pytest.skip(f"no x86 kernel library on this host ({kernels.unsupported()})")
    check_library(which)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("objdump") is None, reason="binutils' objdump reads the machine code")
def test_the_avx2_tile_kernels_prefetch_their_weights() -> None:
    if "avx2" not in kernels.cpu_flags():
        pytest.skip("the AVX2 library is built for an AVX2 host")
    check_library("avx2")
