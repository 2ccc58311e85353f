"""Model stage, CUDA backend: split-K for the fused GEMMs, deterministic and batch-invariant.

At a few rows a GEMM of ChatTTS's widths has 48-192 column tiles, too few programs to keep an H100/H200's HBM busy:
each program walks the whole K loop with one load in flight after another. Split-K cuts K into `splits` equal
ranges, one program each; each stores its fp32 partial tile, and the program that arrives last at the tile's
counter (an atomic per row-and-column tile, reset by that program) adds the partials in split order 0, 1, 2, ...
and runs the epilogue.

NOTE (batch invariance): `splits_for` depends on the weight's shape and tile only, never on M, and the partials are
added in one fixed order whichever program finishes last, so a row's bits are the same alone and in any batch.
Partials live in a `SplitWorkspace` of [splits, rows, width] fp32 per launch; a launch of more rows than the
workspace holds runs as several launches of at most `workspace.rows` rows (rows are independent, so the bits are
the same).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
import triton
import triton.language as tl

TARGET_PROGRAMS = 264  # programs at one row tile: two per SM of an H100/H200 (132 SMs)
MIN_CHUNKS = 3  # BLOCK_K chunks per K range at least: a shorter loop never fills the num_stages-deep pipeline
WORKSPACE_ROWS = 512  # rows a layer's workspace serves per launch (decode batches; prefill chunks run in slices)


def splits_for(column_tiles: int, k_chunks: int, target: int = TARGET_PROGRAMS, min_chunks: int = MIN_CHUNKS) -> int:
    """The most K ranges (a divisor of k_chunks, so every range has whole chunks, at least min_chunks of them) that
    keep one row tile's programs within `target`; 1 when the column tiles alone reach it. Split-K pays at a few rows
    (the column tiles alone leave SMs idle) and costs at many (fp32 partials of splits x rows x columns written and
    read back), so it stops at two programs an SM; the count stays a function of the weight alone (batch
    invariance)."""
    return max(s for s in range(1, k_chunks + 1)
               if k_chunks % s == 0 and (s == 1 or (column_tiles * s <= target and k_chunks // s >= min_chunks)))


class SplitWorkspace(NamedTuple):
    """Partials [rows * max_width] fp32 (one launch's [splits, rows, width]) and one int32 counter per (row tile,
    column tile), zero between launches."""

    partials: torch.Tensor
    counters: torch.Tensor
    rows: int

    @classmethod
    def allocate(cls, rows: int, max_width: int, max_column_tiles: int, block_m: int,
                 device: torch.device) -> SplitWorkspace:
        """max_width: the largest splits x partial columns a launch stores per row."""
        tiles = triton.cdiv(rows, block_m) * max_column_tiles
        return cls(torch.empty(rows * max_width, dtype=torch.float32, device=device),
                   torch.zeros(tiles, dtype=torch.int32, device=device), rows)

    def fits(self, rows: int, width: int, column_tiles: int, block_m: int) -> bool:
        return (rows <= self.rows and rows * width <= self.partials.numel()
                and triton.cdiv(rows, block_m) * column_tiles <= self.counters.numel())


class Split(NamedTuple):
    """One launch's split-K: `splits` K ranges of `k_split` positions each (whole BLOCK_K chunks)."""

    splits: int
    k_split: int


# launch(grid, rows, partials, counters, split): one launch of the kernel over rows [rows.start, rows.stop)
Launch = Callable[[tuple[int, int, int], slice, torch.Tensor, torch.Tensor, Split], None]


@functools.lru_cache(maxsize=256)  # a pure function of a few ints, asked at every launch
def plan(columns: int, k: int, block_n: int, block_k: int, splits: int | None = None) -> Split:
    """The split of a GEMM with `columns` output columns (pairs in the two-output kernels) over K = k; `splits`
    None: splits_for's choice."""
    chunks = triton.cdiv(k, block_k)
    chosen = splits_for(triton.cdiv(columns, block_n), chunks) if splits is None else splits
    if chosen < 1 or chunks % chosen:
        raise ValueError(f"splits: must divide the {chunks} K chunks of {block_k}, got {chosen}")
    return Split(chosen, chunks // chosen * block_k)


def launch_split(m: int, columns: int, width: int, k: int, block: tuple[int, int, int],
                 workspace: SplitWorkspace | None, splits: int | None, device: torch.device, launch: Launch) -> None:
    """Runs `launch` once per row slice the workspace holds (once without a workspace). width: the partial columns a
    split stores per row (columns, or twice them in the two-output kernels); block: (BLOCK_M, BLOCK_N, BLOCK_K)."""
    block_m, block_n, block_k = block
    split = plan(columns, k, block_n, block_k, splits)
    column_tiles = triton.cdiv(columns, block_n)
    if split.splits == 1:  # one launch; the kernel reads no partials or counters (any fp32 / int32 tensors do)
        space = workspace or SplitWorkspace.allocate(1, 1, 1, block_m, device)
        launch((triton.cdiv(m, block_m), column_tiles, 1), slice(0, m), space.partials, space.counters, split)
        return
    for start, end in row_slices(m, workspace):
        space = workspace_for(end - start, split.splits * width, column_tiles, block_m, workspace, device)
        launch((triton.cdiv(end - start, block_m), column_tiles, split.splits), slice(start, end), space.partials,
               space.counters, split)


def workspace_for_gemms(gemms: list[tuple[int, int, int, tuple[int, int, int]]], rows: int,
                        device: torch.device) -> SplitWorkspace:
    """One scratch for GEMMs that run one after another: each (columns, width, k, (BLOCK_M, BLOCK_N, BLOCK_K)) as
    launch_split takes them; sized for `rows` rows of the widest split launch."""
    widths, tiles, block_m = [1], [1], min(block[0] for *_, block in gemms)
    for columns, width, k, (_, block_n, block_k) in gemms:
        split = plan(columns, k, block_n, block_k)
        if split.splits > 1:
            widths.append(split.splits * width)
            tiles.append(triton.cdiv(columns, block_n))
    return SplitWorkspace.allocate(rows, max(widths), max(tiles), block_m, device)


def workspace_for(rows: int, width: int, column_tiles: int, block_m: int, workspace: SplitWorkspace | None,
                  device: torch.device) -> SplitWorkspace:
    """The given workspace when it holds `rows` rows of this launch, else a fresh one for this call alone."""
    if workspace is not None and workspace.fits(rows, width, column_tiles, block_m):
        return workspace
    return SplitWorkspace.allocate(rows, width, column_tiles, block_m, device)


def row_slices(rows: int, workspace: SplitWorkspace | None) -> list[tuple[int, int]]:
    """[start, end) row ranges of at most workspace.rows (one range without a workspace)."""
    step = workspace.rows if workspace is not None else max(rows, 1)
    return [(start, min(start + step, rows)) for start in range(0, max(rows, 1), step)]


@triton.jit
def reduce_pair(part_ptr, count_ptr, acc1, acc2, rows, rows_ok, cols, cols_ok, M, COLUMNS: tl.constexpr,
                SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # -> (acc1, acc2, last): with SPLITS > 1 this program's two fp32 tiles go to partials [SPLITS, M, 2 COLUMNS]
    # (acc1 at cols, acc2 at COLUMNS + cols); the program that arrives last at its (row tile, column tile) counter
    # gets every split's sums, added in split order, and resets the counter; the others get last False
    last = True
    if SPLITS > 1:
        tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        split = tl.program_id(2)
        _store(part_ptr, acc1, split, rows, rows_ok, cols, cols_ok, M, 2 * COLUMNS)
        _store(part_ptr, acc2, split, rows, rows_ok, cols + COLUMNS, cols_ok, M, 2 * COLUMNS)
        tl.debug_barrier()  # every thread's partial stores precede the release below
        last = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel") == SPLITS - 1
        if last:
            acc1 = _sum(part_ptr, rows, rows_ok, cols, cols_ok, M, 2 * COLUMNS, SPLITS, BLOCK_M, BLOCK_N)
            acc2 = _sum(part_ptr, rows, rows_ok, cols + COLUMNS, cols_ok, M, 2 * COLUMNS, SPLITS, BLOCK_M, BLOCK_N)
            tl.store(count_ptr + tile, 0)
    return acc1, acc2, last


@triton.jit
def reduce_one(part_ptr, count_ptr, acc, rows, rows_ok, cols, cols_ok, M, COLUMNS: tl.constexpr,
               SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # reduce_pair for one accumulator: partials [SPLITS, M, COLUMNS] -> (acc, last)
    last = True
    if SPLITS > 1:
        tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        _store(part_ptr, acc, tl.program_id(2), rows, rows_ok, cols, cols_ok, M, COLUMNS)
        tl.debug_barrier()  # every thread's partial stores precede the release below
        last = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel") == SPLITS - 1
        if last:
            acc = _sum(part_ptr, rows, rows_ok, cols, cols_ok, M, COLUMNS, SPLITS, BLOCK_M, BLOCK_N)
            tl.store(count_ptr + tile, 0)
    return acc, last


@triton.jit
def _store(part_ptr, acc, split, rows, rows_ok, cols, cols_ok, M, WIDTH: tl.constexpr):
    # this program's fp32 tile of split `split` into partials [SPLITS, M, WIDTH] at columns cols
    offs = (split * M + rows[:, None]).to(tl.int64) * WIDTH + cols[None, :]
    tl.store(part_ptr + offs, acc, mask=rows_ok[:, None] & cols_ok[None, :])


@triton.jit
def _sum(part_ptr, rows, rows_ok, cols, cols_ok, M, WIDTH: tl.constexpr, SPLITS: tl.constexpr,
         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # the splits' partial tiles added in split order; .cg: read from L2, not a stale L1
    total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ok = rows_ok[:, None] & cols_ok[None, :]
    for s in tl.static_range(SPLITS):
        offs = (s * M + rows[:, None]).to(tl.int64) * WIDTH + cols[None, :]
        total += tl.load(part_ptr + offs, mask=ok, other=0.0, cache_modifier=".cg")
    return total
