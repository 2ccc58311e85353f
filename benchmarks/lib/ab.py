"""The one A/B harness: variants measured in turn, round after round, so that a noisy host slows each alike.

Every benchmark that compares variants in one run goes through `interleaved`: two source trees (tree_ab.py,
bench_host.py), two precisions (bench_audio_dtype.py, bench_decode.py), audio paths (audio_parts.py), ISA paths
(bench_isa.py), kernels (bench_kernels.py). A figure is then read from the rounds (best, median, or the median of the
per-round ratios).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

Variant = TypeVar("Variant")
Measured = TypeVar("Measured")


def interleaved(variants: Sequence[Variant], rounds: int, measure: Callable[[Variant], Measured],
                echo: bool = False, warm_up: bool = False) -> list[list[Measured]]:
    """`rounds` rounds, each measuring every variant once in turn: per variant (in order), one result per round.
    warm_up: one round first whose results are dropped (packing, caches, oneDNN's kernels); echo: each result
    printed as it comes."""
    runs: list[list[Measured]] = [[] for _ in variants]
    for round_ in range(-1 if warm_up else 0, rounds):
        for variant, results in zip(variants, runs, strict=True):
            result = measure(variant)
            if round_ >= 0:
                results.append(result)
                if echo:
                    print(variant, result, flush=True)
    return runs


def by_name(names: Sequence[str], runs: list[list[Measured]]) -> dict[str, list[Measured]]:
    """interleaved's runs keyed by each variant's name."""
    return dict(zip(names, runs, strict=True))
