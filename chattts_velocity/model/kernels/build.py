"""The CPU kernels' build: their sources compiled by g++ into one library per ISA, cached on disk."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

DRIVERS = [Path(__file__).parent / f"cpu_{name}.cpp" for name in ("linear", "attention", "decode_layer", "heads",
                                                                     "sampling", "audio", "audio_linear", "register")]
HEADERS = sorted(Path(__file__).parent.glob("*.h"))
BASE_FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-fvisibility=hidden"]


@dataclass(frozen=True)
class Isa:
    """One build of the kernels: the CPU flags it needs (/proc/cpuinfo names), its compiler flags, extra sources."""

    cpu_flags: tuple[str, ...]
    compiler_flags: tuple[str, ...]
    extra_sources: tuple[str, ...] = ()


def build_library(which: str, spec: Isa) -> Path:
    """Compile the sources once per (ISA, sources, flags, torch, python); concurrent builders each write a temporary
    file and rename it into place, so readers only ever see a complete library."""
    from torch.utils import cpp_extension

    sources = DRIVERS + [Path(__file__).parent / name for name in spec.extra_sources]
    flags = [*BASE_FLAGS, *spec.compiler_flags, f"-DCV_OPS=chattts_velocity_{which}"]
    source = b"".join(path.read_bytes() for path in sources + HEADERS) + " ".join(flags).encode()
    key = hashlib.sha256(source + torch.__version__.encode() + sys.version.encode()).hexdigest()[:16]
    cache = Path(os.environ.get("CHATTTS_VELOCITY_CACHE") or Path.home() / ".cache" / "chattts_velocity")
    target = cache / "kernels" / key / f"cpu_kernels_{which}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"note: building the CPU kernels ({which}) with g++, once: about 25 s on 2 cores (cached in "
          f"{target.parent.parent})", file=sys.stderr, flush=True)
    libs, compiler = cpp_extension.library_paths(), os.environ.get("CXX", "g++")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        common = [*flags, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *(f"-I{p}" for p in cpp_extension.include_paths()),
                  f"-I{sysconfig.get_paths()['include']}"]
        objects = [Path(tmp) / f"{path.stem}.o" for path in sources]
        _run_all([[compiler, *common, "-c", str(path), "-o", str(obj)]  # one process per source: every core
                  for path, obj in zip(sources, objects, strict=True)])
        _run_all([[compiler, *flags, *map(str, objects), "-o", str(built), *(f"-L{p}" for p in libs),
                   *(f"-Wl,-rpath,{p}" for p in libs), "-lc10", "-ltorch_cpu"]])
        os.replace(built, target)
    return target


def _run_all(commands: list[list[str]]) -> None:
    """Run the commands at once; RuntimeError with the first failure's output."""
    running = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True) for c in commands]
    outputs = [(p.communicate(timeout=600)[0], p.returncode) for p in running]
    failed = [out for out, code in outputs if code != 0]
    if failed:
        raise RuntimeError(failed[0])
