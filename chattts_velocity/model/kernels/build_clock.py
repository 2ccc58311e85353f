"""How long a kernel build takes on this host: the estimate its notice prints, and the record a build leaves.

A build compiles every source at once (one g++ process each). Its wall time is about the sources' total CPU time
divided by the cores the processes get, never less than the slowest source. The CPU time per source is REFERENCE's
(measured on a Zen 4 vCPU) scaled by a probe of this CPU's speed (a fixed Python loop); the cores the build gets are
the probe's share of a core on a busy host (where Linux shares the CPUs between sessions, not processes) and up to
every core on an idle one. The last build here (build_times.json in the cache) corrects that model by its measured
over estimated time.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

# CPU seconds of each source's g++ -O3 (AVX2 flags) on an AMD EPYC Zen 4 vCPU, and the probe's CPU seconds there
# (build_times.json of a build on that host); cpu_amx.cpp (AVX-512 builds only) as the mean of the others.
REFERENCE = {"cpu_linear.cpp": 7.5, "cpu_attention.cpp": 6.6, "cpu_decode_layer.cpp": 7.1, "cpu_heads.cpp": 6.2,
             "cpu_sampling.cpp": 7.3, "cpu_audio.cpp": 6.6, "cpu_audio_linear.cpp": 6.3, "cpu_register.cpp": 9.1}
REFERENCE_PROBE_S = 0.016
RECORD = "build_times.json"


@dataclass(frozen=True)
class Probe:
    cpu_s: float  # CPU seconds of a fixed integer loop (this core's speed: smaller is faster)
    share: float  # the fraction of a core this process got meanwhile (CPU / wall time)


def probe() -> Probe:
    """A fixed integer loop, 8 rounds of ~15 ms of CPU on a Zen 4 core: its best round, and CPU over wall time."""
    rounds, wall, cpu = [], time.perf_counter(), time.process_time()
    for _ in range(8):
        start = time.process_time()
        total = 0
        for i in range(200_000):
            total += i * i % 7
        rounds.append(time.process_time() - start)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return Probe(max(min(rounds), 1e-4), min(1.0, cpu / max(wall, 1e-6)))


@dataclass(frozen=True)
class Estimate:
    seconds: float
    model_s: float  # before the last build's correction
    basis: str  # what it rests on, for the notice


def estimate(sources: list[str], cache: Path, jobs: int) -> Estimate:
    """The wall time of compiling `sources` (file names) at `jobs` processes at once, on this host as it is now."""
    now = probe()
    mean = sum(REFERENCE.values()) / len(REFERENCE)
    times = [now.cpu_s / REFERENCE_PROBE_S * REFERENCE.get(name, mean) for name in sources]
    cores = os.cpu_count() or 1
    if now.share < 0.9:  # a busy host: the scheduler shares the CPUs by session, so more processes get no more
        share = now.share
    else:
        others = max(0.0, os.getloadavg()[0] - 1.0)  # runnable processes besides this one
        share = min(float(jobs), cores * jobs / (jobs + others))
    model = max(max(times), sum(times) / share)
    try:
        last = json.loads((cache / RECORD).read_text(encoding="utf-8"))
        correction = min(3.0, max(1 / 3, float(last["wall_s"]) / float(last["model_s"])))
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return Estimate(model, model, "this CPU's speed and load now")
    return Estimate(model * correction, model, f"this CPU's speed and load now, corrected by the last build here "
                                               f"({float(last['wall_s']):.0f} s)")


def record(cache: Path, cpu_s: dict[str, float], wall_s: float, guess: Estimate) -> None:
    """Keep this build's times beside the estimate's model, for the next estimate on this host (best effort)."""
    data = {"cpu_s": cpu_s, "wall_s": wall_s, "model_s": guess.model_s, "estimate_s": guess.seconds,
            "probe_s": probe().cpu_s, "cores": os.cpu_count(), "load": os.getloadavg()[0]}
    try:
        (cache / RECORD).write_text(json.dumps(data, indent=1), encoding="utf-8")
    except OSError:
        pass
