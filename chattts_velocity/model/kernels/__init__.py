"""Model stage: optional C++ CPU kernels (cpu_*.cpp), built with the system's C++ compiler on first use.

cpu_linear.cpp (batch-invariant bf16 / int8 linears), cpu_amx.cpp (the same with AMX, used on AMX CPUs),
cpu_attention.cpp (paged decode attention), cpu_decode_layer.cpp (a whole decode layer as one op).

`load()` -> True when `torch.ops.chattts_velocity_cpu.*` are ready. It never raises: on a CPU without AVX-512
BF16, without g++, or with CHATTTS_VELOCITY_CPU_KERNELS=0, callers keep torch's own kernels (and a warning
says why once); CHATTTS_VELOCITY_CPU_KERNELS=noamx keeps the AVX-512 kernels on an AMX CPU. The build takes about a minute and is cached per source, torch and Python version in
$CHATTTS_VELOCITY_CACHE/kernels (default ~/.cache/chattts_velocity/kernels).
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path

import torch

SOURCES = sorted(Path(__file__).parent.glob("cpu_*.cpp"))  # linked into one library
HEADERS = sorted(Path(__file__).parent.glob("cpu_*.h"))
ENV_SWITCH = "CHATTTS_VELOCITY_CPU_KERNELS"
CPU_FLAGS = ("avx512f", "avx512bw", "avx512_bf16")
COMPILER_FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl",
                  "-mavx512bf16", "-mfma", "-mamx-tile", "-mamx-bf16"]


@functools.cache
def load() -> bool:
    reason = _unsupported()
    if reason is None:
        try:
            torch.ops.load_library(str(_build()))
            _register_fakes()
            return True
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            reason = f"building them failed ({str(exc).strip()[-600:]})"
    if os.environ.get(ENV_SWITCH, "1") != "0":
        warnings.warn(f"chattts_velocity: CPU decode kernels unavailable: {reason}; using torch's kernels",
                      RuntimeWarning, stacklevel=2)
    return False


def unsupported() -> str | None:
    """Why the C++ CPU kernels cannot run on this machine (from its OS, architecture and CPU flags), or None."""
    return _unsupported()


def _unsupported() -> str | None:
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return f"{ENV_SWITCH}=0"
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"they need Linux on x86-64, this is {platform.system()} {platform.machine()}"
    flags = _cpu_flags()
    missing = [f for f in CPU_FLAGS if f not in flags]
    if missing:
        return f"this CPU lacks {', '.join(missing)}"
    return None


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def _build() -> Path:
    """Compile the sources once per (sources, torch, python); concurrent builders each write a temporary
    file and rename it into place, so readers only ever see a complete library."""
    from torch.utils import cpp_extension

    source = b"".join(path.read_bytes() for path in SOURCES + HEADERS)
    key = hashlib.sha256(source + torch.__version__.encode() + sys.version.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("CHATTTS_VELOCITY_CACHE") or Path.home() / ".cache" / "chattts_velocity")
    target = cache / "kernels" / key / "cpu_kernels.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    libs = cpp_extension.library_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        command = [os.environ.get("CXX", "g++"), *COMPILER_FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                   *(f"-I{p}" for p in cpp_extension.include_paths()), f"-I{sysconfig.get_paths()['include']}",
                   *map(str, SOURCES), "-o", str(built), *(f"-L{p}" for p in libs), *(f"-Wl,-rpath,{p}" for p in libs),
                   "-lc10", "-ltorch_cpu"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(done.stderr or done.stdout)
        os.replace(built, target)
    return target


def _register_fakes() -> None:
    """Output shapes for torch.compile's tracing (the batch dimension stays symbolic)."""

    @torch.library.register_fake("chattts_velocity_cpu::linear_bf16")
    def _bf16(x, weight):
        return x.new_empty(x.shape[0], weight.shape[0] * weight.shape[2])

    @torch.library.register_fake("chattts_velocity_cpu::linear_int8")
    def _int8(x, weight, scales):
        return x.new_empty(x.shape[0], scales.shape[0])

    @torch.library.register_fake("chattts_velocity_cpu::paged_decode_attention")
    def _attention(q, k_cache, v_cache, block_tables, context_lens, scale):
        return torch.empty_like(q)


def to_tiles(weight: torch.Tensor, chunk: int) -> torch.Tensor:
    """weight [N, K] -> [N/4, K/chunk, 4, chunk], the layout cpu_linear.cpp streams (N % 4 == K % chunk == 0)."""
    n, k = weight.shape
    return weight.reshape(n // 4, 4, k // chunk, chunk).transpose(1, 2).contiguous()


def fits_tiles(weight: torch.Tensor, chunk: int) -> bool:
    n, k = weight.shape
    return n % 4 == 0 and k % chunk == 0


@functools.cache
def amx_ready() -> bool:
    """True when the kernels are loaded and cpu_amx.cpp can run here (AMX-BF16, and Linux granted its state),
    unless CHATTTS_VELOCITY_CPU_KERNELS=noamx asks for the AVX-512 kernels (to test them on an AMX CPU)."""
    if os.environ.get(ENV_SWITCH, "1") == "noamx":
        return False
    return load() and {"amx_tile", "amx_bf16"} <= _cpu_flags() and torch.ops.chattts_velocity_cpu.amx_ready()


def from_panels(panels: torch.Tensor) -> torch.Tensor:
    """The inverse of to_panels: [N/16, K/2, 16, 2] -> [N, K]."""
    n16, k2 = panels.shape[:2]
    return panels.permute(0, 2, 1, 3).reshape(n16 * 16, k2 * 2)


def from_tiles(tiles: torch.Tensor) -> torch.Tensor:
    """The inverse of to_tiles: [N/4, K/chunk, 4, chunk] -> [N, K]."""
    n4, kc, _, chunk = tiles.shape
    return tiles.transpose(1, 2).reshape(n4 * 4, kc * chunk)


def to_panels(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] (bf16 or int8) -> [N/16, K/2, 16, 2], the layout cpu_amx.cpp streams (N % 16 == K % 32 == 0)."""
    n, k = weight.shape
    return weight.reshape(n // 16, 16, k // 2, 2).permute(0, 2, 1, 3).contiguous()


def fits_panels(weight: torch.Tensor) -> bool:
    n, k = weight.shape
    return n % 16 == 0 and k % 32 == 0
