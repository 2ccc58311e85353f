"""Benchmark helpers: how much CPU the host grants right now, and what this process used.

The probe times a fixed fp32 GEMM loop with 1 thread and with the benchmark's thread count. On a
shared host the GFLOP/s fall when other tenants run; `granted_cores` compares the all-thread rate
with an uncontended core of this machine kind (NOMINAL_GFLOPS_PER_CORE, measured on a quiet host).
"""
from __future__ import annotations

import os
import resource
import time

import torch

NOMINAL_GFLOPS_PER_CORE = 100.0  # 512^3 fp32 GEMM, one quiet Xeon/EPYC core with AVX-512 (see docs/performance.md)
PROBE_SECONDS = 0.4


def matmul_gflops(threads: int, size: int = 512) -> float:
    """Best-of-3 GFLOP/s of a size^3 fp32 GEMM loop on `threads` threads (restores the thread count)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        a @ b
        best = 0.0
        for _ in range(3):
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < PROBE_SECONDS / 3:
                a @ b
                count += 1
            best = max(best, 2 * size**3 * count / (time.perf_counter() - start) / 1e9)
        return best
    finally:
        torch.set_num_threads(saved)


def cpu_pressure() -> float | None:
    """Linux PSI: % of the last 10 s in which some runnable task waited for a CPU (None if unavailable)."""
    try:
        with open("/proc/pressure/cpu", encoding="ascii") as f:
            return float(f.readline().split()[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        return None


def contention_probe(threads: int) -> dict:
    one = matmul_gflops(1)
    many = matmul_gflops(threads) if threads > 1 else one
    granted = many / NOMINAL_GFLOPS_PER_CORE
    psi = cpu_pressure()
    summary = f"{one:.0f} GFLOP/s on 1 thread, {many:.0f} on {threads} (~{granted:.2f} cores granted)"
    if psi is not None:
        summary += f", CPU pressure {psi:.0f}%"
    return {"gflops_1_thread": one, "gflops_all_threads": many, "threads": threads,
            "granted_cores": granted, "cpu_pressure_avg10": psi, "summary": summary}


def process_cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (all threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB.

    VmHWM where available: getrusage's ru_maxrss survives exec, so a subprocess would report its
    parent's peak.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def thread_settings() -> dict:
    """What decides how many cores the run may use."""
    keys = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "KMP_BLOCKTIME")
    return {"torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            **{k: os.environ.get(k) for k in keys}}


def read_gbps(threads: int, megabytes: int = 400) -> float:
    """Best-of-5 streaming-read GB/s (`x.sum()` over a tensor far larger than the caches) on `threads` threads."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(megabytes * 2**20 // 4)
        x.sum()
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            x.sum()
            best = min(best, time.perf_counter() - start)
        return x.numel() * 4 / best / 1e9
    finally:
        torch.set_num_threads(saved)


def bf16_gemm_gflops(threads: int, size: int = 2048) -> float:
    """Best-of-3 GFLOP/s of a size^3 bf16 GEMM (torch's oneDNN) on `threads` threads: the compute ceiling."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size).bfloat16(), torch.randn(size, size).bfloat16()
        a @ b
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
        return 2 * size**3 / best / 1e9
    finally:
        torch.set_num_threads(saved)


def cpu_identity() -> dict:
    """CPU model, family, the ISA flags that pick kernels, and the host kind that names the results file."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(info.get("flags", "").split())
    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8", "amx_tile")
    model, family = info.get("model name", "unknown"), info.get("cpu family", "?")
    return {"model": model, "cpu_family": family, "cpu_model": info.get("model", "?"),
            "flags": [f for f in wanted if f in flags], "host_kind": host_kind(model, family, flags)}


def host_kind(model: str, family: str, flags: set[str]) -> str:
    """e.g. `spr-amx`, `zen5-avx512bf16`, `x86-avx2`: the CPUID family + the best matmul ISA it has."""
    isa = ("amx" if "amx_bf16" in flags else "avx512bf16" if "avx512_bf16" in flags
           else "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "base")
    if "AMD" in model or "EPYC" in model:  # family 25 = Zen 3/4 (Zen 4 has AVX-512), 26 = Zen 5
        name = {"25": "zen4" if "avx512f" in flags else "zen3", "26": "zen5"}.get(family, "amd")
    elif "Intel" in model or "Xeon" in model:
        name = "spr" if "amx_bf16" in flags else "intel"
    else:
        name = "x86"
    return f"{name}-{isa}"
