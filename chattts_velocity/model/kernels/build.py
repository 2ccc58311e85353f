"""The CPU kernels' build: their sources compiled by g++ into one library per ISA, cached on disk (once per install:
the key is the ISA, sources, flags, torch and Python), every source at once (MAX_JOBS caps the processes), with an
estimate of its time before it starts (build_clock.py) and a line per finished source."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import build_clock

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
    jobs = max(1, int(os.environ.get("MAX_JOBS") or len(sources)))
    guess = build_clock.estimate([p.name for p in sources], cache / "kernels", min(jobs, len(sources)))
    print(f"note: building the CPU kernels ({which}) with g++, once per install: about {guess.seconds:.0f} s here "
          f"({guess.basis}; cached in {target.parent.parent})", file=sys.stderr, flush=True)
    libs, compiler = cpp_extension.library_paths(), os.environ.get("CXX", "g++")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        common = [*flags, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *(f"-I{p}" for p in cpp_extension.include_paths()),
                  f"-I{sysconfig.get_paths()['include']}"]
        objects = [Path(tmp) / f"{path.stem}.o" for path in sources]
        progress = Progress(len(sources) + 1)
        cpu_s = _run_all({path.name: [compiler, *common, "-c", str(path), "-o", str(obj)]  # one process per source
                          for path, obj in zip(sources, objects, strict=True)}, jobs, progress)
        link = [compiler, *flags, *map(str, objects), "-o", str(built), *(f"-L{p}" for p in libs),
                *(f"-Wl,-rpath,{p}" for p in libs), "-lc10", "-ltorch_cpu"]
        cpu_s |= _run_all({"the link": link}, 1, progress)
        os.replace(built, target)
    wall = time.perf_counter() - start
    build_clock.record(cache / "kernels", {k: round(v, 2) for k, v in cpu_s.items() if k != "the link"}, wall, guess)
    print(f"note: the CPU kernels ({which}) built in {wall:.0f} s", file=sys.stderr, flush=True)
    return target


class Progress:
    """One line on stderr per finished step ("[3/9] cpu_audio.cpp done, 41 s"); on a terminal the line is redrawn."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.start = total, 0, time.perf_counter()
        self.tty = sys.stderr.isatty()

    def step(self, name: str) -> None:
        self.done += 1
        line = f"  [{self.done}/{self.total}] {name} done, {time.perf_counter() - self.start:.0f} s"
        end = "\n" if not self.tty or self.done == self.total else ""
        print(("\r" if self.tty else "") + line, end=end, file=sys.stderr, flush=True)


def _run_all(commands: dict[str, list[str]], jobs: int, progress: Progress) -> dict[str, float]:
    """Run the commands, `jobs` at a time; each one's CPU seconds by name; RuntimeError with the first failure's
    output."""
    waiting = list(commands.items())
    running: dict[int, tuple[str, subprocess.Popen[str], _Reader]] = {}
    cpu_s: dict[str, float] = {}
    failures: list[str] = []
    while waiting or running:
        while waiting and len(running) < jobs:
            name, command = waiting.pop(0)
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, text=True)
            running[proc.pid] = (name, proc, _drain(proc))
        time.sleep(0.05)
        for pid in list(running):
            done, status, usage = os.wait4(pid, os.WNOHANG)  # this child only: its CPU time once it ended
            if done != pid:
                continue
            name, proc, output = running.pop(pid)
            proc.returncode = os.waitstatus_to_exitcode(status)
            output.join()
            cpu_s[name] = usage.ru_utime + usage.ru_stime
            if proc.returncode != 0:
                failures.append("".join(output.lines))
            else:
                progress.step(name)
    if failures:
        raise RuntimeError(failures[0])
    return cpu_s


class _Reader(threading.Thread):
    """Reads a child's output as it comes (a full pipe would stall the compiler)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        super().__init__(daemon=True)
        self.proc, self.lines = proc, list[str]()

    def run(self) -> None:
        assert self.proc.stdout is not None
        self.lines.extend(self.proc.stdout)


def _drain(proc: subprocess.Popen[str]) -> _Reader:
    reader = _Reader(proc)
    reader.start()
    return reader
