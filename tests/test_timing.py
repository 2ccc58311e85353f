"""tests/timing.py reads the load it is meant to read: host_slowness() rises when this process gets a smaller share
of the CPU (here: three threads contending for the GIL), so bounds scaled by it widen on a busy host."""
from __future__ import annotations

import threading

from timing import Slowness, cpu_unit, host_slowness, unit_of_work


def test_the_probe_reads_a_busier_process_as_slower() -> None:
    """Three spinning threads leave the probe about a quarter of the GIL: compared with the same probe just before
    and just after (on this host, now; the least of 3 each side, so a burst of other load on one side does not
    count), it reads at least 1.5x slower, whatever the host's own load."""
    before = min(host_slowness() for _ in range(3))
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            unit_of_work()

    threads = [threading.Thread(target=spin, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        busy = host_slowness()
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    alone = min(before, *(host_slowness() for _ in range(3)))
    assert busy > 1.5 * alone, (alone, busy)


def test_slowness_keeps_its_largest_sample_and_scales_by_it() -> None:
    slowness = Slowness().sample()
    assert len(slowness.samples) == 2 and all(s >= 1.0 for s in slowness.samples)
    assert slowness.factor == max(slowness.samples) and slowness.scaled(0.5) == 0.5 * slowness.factor
    assert cpu_unit() > 0
