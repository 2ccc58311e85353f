"""Time bounds that hold on a slow or busy host: every bound a test asserts on a duration is a calibration measured
in the same run, on the same host, scaled by a constant whose meaning the test states.

- `cpu_unit()`: the CPU seconds of a fixed piece of pure-Python work on this host now; for bounds on CPU time
  ("refusing it costs under 25 units; decompressing the bomb costs over 100").
- `host_slowness()`: how much slower this host runs that work in wall-clock time now than a quiet reference host
  (a 2024 x86 server core), at least 1. A bound written for the reference host ("/health answers within 0.5 s")
  times this factor holds on a host twice as loaded, and a real stall still fails it: the stall stretches by the
  same factor.
- `Slowness`: host_slowness() sampled before and after the timed work, the largest sample kept, so a bound holds
  when the load rose in between.
"""
from __future__ import annotations

import statistics
import time

REFERENCE_UNIT_S = 0.002  # seconds of unit_of_work() on a quiet 2024 x86 server core (CPU and wall alike)
SLOWNESS_UNITS = 15  # one wall-clock sample: ~30 ms on the reference host, several scheduler periods on a busy one


def unit_of_work() -> None:
    """A fixed piece of pure-Python work (~2 ms on the reference host)."""
    text = "abcdefghij" * 410
    for _ in range(20):
        sum(ord(c) for c in text)


def cpu_unit() -> float:
    """CPU seconds of unit_of_work() on this host, measured now (the least of 5 runs)."""
    def once() -> float:
        started = time.process_time()
        unit_of_work()
        return time.process_time() - started
    return min(once() for _ in range(5))


def host_slowness() -> float:
    """Wall seconds of SLOWNESS_UNITS units now over their time on the reference host, at least 1: the median of 3
    samples, each long enough to span several of the scheduler's periods, so it reads the share of a core this
    process gets under the present load, not one lucky time slice."""
    def once() -> float:
        started = time.perf_counter()
        for _ in range(SLOWNESS_UNITS):
            unit_of_work()
        return time.perf_counter() - started
    return max(1.0, statistics.median(once() for _ in range(3)) / (SLOWNESS_UNITS * REFERENCE_UNIT_S))


class Slowness:
    """host_slowness() sampled when made and at each sample(): `factor` is the largest sample."""

    def __init__(self) -> None:
        self.samples = [host_slowness()]

    def sample(self) -> Slowness:
        self.samples.append(host_slowness())
        return self

    @property
    def factor(self) -> float:
        return max(self.samples)

    def scaled(self, reference_s: float) -> float:
        """`reference_s` seconds on the reference host, on this host as it ran during the test."""
        return reference_s * self.factor

    def __repr__(self) -> str:
        return f"slowness {self.factor:.2f} (samples {', '.join(f'{s:.2f}' for s in self.samples)})"
