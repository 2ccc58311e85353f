"""Model stage: optional C++ CPU kernels, built with the system's C++ compiler on first use, one library per ISA.

Drivers shared by every ISA: cpu_linear.cpp (batch-invariant bf16 / int8 / int4 linears over one tile layout; int4,
and int8 where int8_q8() opts in, times activations quantised per 32 columns, q8_rows.h), cpu_attention.cpp +
attention_rows.h (paged decode attention), cpu_decode_layer.cpp (a whole decode layer as one op), cpu_heads.cpp
(the fp32 output heads, row-invariant), cpu_sampling.cpp (the sampler's processor chain and draw as one op). Their
inner loops come from one micro-kernel header per ISA: isa_avx512.h (AVX-512 BF16 and VNNI, plus cpu_amx.cpp on AMX
CPUs), isa_avx2.h (AVX2 + FMA), isa_neon.h (aarch64 NEON; dotprod / bf16 / i8mm where the compiler targets them),
each on isa_common.h (the tile kernels' loop and exp, written once over each ISA's operations) and checked by
isa_contract.h; on AVX-512 and AVX2 the weight-only int8 tiles multiply x as int16 per row (isa_avx512_q16.h,
isa_avx2_q16.h). The packed layouts live on 2 MiB-page arenas (pages.py).
cpu_audio.cpp: the audio ConvNeXt blocks' depthwise conv + LayerNorm and layer scale, channels-last
(audio/cpu_decode.py).

The ISA is chosen once from the CPU flags (isa(); CHATTTS_VELOCITY_CPU_KERNELS overrides it: "avx2" runs the AVX2
kernels on any x86 CPU with AVX2 + FMA, "noamx" the AVX-512 tiles on an AMX CPU, "0" none). `load()` -> True when
`ops()` (torch.ops.chattts_velocity_<isa>) is ready. It never raises: without a supported ISA, without g++, or
with the switch at 0, callers keep torch's own kernels (PackedLinear warns once per precision, naming it and the
reason). A build (one g++ process per source, all at once; MAX_JOBS caps them) takes about 60 CPU-seconds on a
Zen 4 vCPU (so about 30 s on an idle 2-core host, an estimate), announces its estimate for this host first
(build.py, build_clock.py) and a line per finished source, and is cached per ISA, source, flags, torch and Python
version in
$CHATTTS_VELOCITY_CACHE/kernels (default ~/.cache/chattts_velocity/kernels): once per install, not per process.
cpu_audio_linear.cpp: the audio linears on bf16 weights in fp32 arithmetic where the CPU has no bf16 arithmetic
(audio/cpu_panels.py).
"""
from __future__ import annotations

import functools
import os
import platform
import subprocess
import warnings
from pathlib import Path
from typing import Any

import torch

from .build import DRIVERS as DRIVERS  # re-exported: the harness test and packaging read them
from .build import HEADERS as HEADERS
from .build import Isa, build_library
from .int4 import INT4_GROUP as INT4_GROUP  # re-exported: the int4 layout's helpers are kernels.*
from .int4 import from_int4_tiles as from_int4_tiles
from .int4 import quantize_int4 as quantize_int4
from .int4 import quantize_q8_rows as quantize_q8_rows
from .int4 import to_int4_tiles as to_int4_tiles
from .pages import on_huge_pages

ENV_SWITCH = "CHATTTS_VELOCITY_CPU_KERNELS"
INT8_SWITCH = "CHATTTS_VELOCITY_INT8_ACTIVATIONS"  # "q8": int8 tiles on integer dot products; unset / "bf16": not
SWITCH_VALUES = ("1", "0", "noamx", "avx512", "avx2", "neon")  # unset = "1": the best ISA of this CPU


ISAS = {
    "avx512": Isa(("avx512f", "avx512bw", "avx512_bf16", "avx512_vnni"),  # every AVX-512 BF16 CPU has VNNI
                  ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx512vnni", "-mfma", "-mamx-tile",
                   "-mamx-bf16"),
                  ("cpu_amx.cpp",)),
    "avx2": Isa(("avx2", "fma"), ("-mavx2", "-mfma")),  # no -mavx512*: runs on any x86 CPU with AVX2 + FMA
    "neon": Isa((), ("-mcpu=native",)),  # the host's extensions (dotprod, bf16, i8mm) where present
}
CPU_FLAGS = ISAS["avx512"].cpu_flags  # kept for callers that name the AVX-512 requirement


def isa() -> str | None:
    """The kernels' ISA in this process: CHATTTS_VELOCITY_CPU_KERNELS ("avx2", "avx512", "noamx" = AVX-512 without
    AMX, "0" = none) or else the best this CPU has; None when none can run (unsupported() says why)."""
    return _choice()[0]


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively: the hosts of the AVX-512 BF16 kernels (AVX-512 BF16 or AMX; the
    switch's "avx2" makes an AVX-512 host answer as an AVX2 one). Precision.decide's cpu_bf16."""
    return isa() == "avx512"


def int8_q8() -> bool:
    """Whether int8 weights in the tile layout multiply x quantised per row and 32-column group to int8 (the Q8 rows
    of quantize_q8_rows; integer dot products: faster from a few rows on, more so on AVX2) rather than x's bf16
    values (weight-only int8, the default: closer to float32). Opt-in: CHATTTS_VELOCITY_INT8_ACTIVATIONS=q8, read
    when a weight is packed."""
    choice = os.environ.get(INT8_SWITCH, "bf16")
    if choice not in ("bf16", "q8"):
        raise ValueError(f"{INT8_SWITCH}={choice!r}: expected 'bf16' or 'q8'")
    return choice == "q8"


def unsupported() -> str | None:
    """Why the C++ CPU kernels cannot run on this machine (from its OS, architecture and CPU flags), or None."""
    return _choice()[1]



def inductor_simdlen() -> int:
    """The vector width in bits of the ISA inductor generates C++ for here, for torch.compile's cpp.simdlen option.
    Inductor takes that ISA from ATEN_CPU_CAPABILITY (the AVX2-only benchmarks set it), but its on-disk graph cache
    is not keyed on the variable: a graph generated for AVX2 (8 floats a vector) and reused in a process that
    compiles it for AVX-512 (16) stores past its buffers (heap corruption), and the converse leaves outputs half
    written. An explicit simdlen selects the same ISA and is part of the key."""
    from torch._inductor import cpu_vec_isa

    return int(cpu_vec_isa.pick_vec_isa().bit_width())


def kernel_path() -> str:
    """What runs a bf16 / int8 / int4 projection here: "amx", "avx512", "avx2", "neon", or "torch"."""
    chosen = isa()
    if chosen is None or not load():
        return "torch"
    return "amx" if amx_ready() else chosen


def ops(which: str | None = None) -> Any:
    """torch.ops namespace of the ISA's library (loaded on first use): linear_bf16, decode_layer, ..."""
    which = which or isa()
    if which is None or not load(which):
        raise RuntimeError(f"the C++ CPU kernels are unavailable: {unsupported()}")
    return getattr(torch.ops, f"chattts_velocity_{which}")


def _choice() -> tuple[str | None, str | None]:
    switch = os.environ.get(ENV_SWITCH, "1")
    if switch == "0":
        return None, f"{ENV_SWITCH}=0"
    if switch not in SWITCH_VALUES:
        return None, f"{ENV_SWITCH}={switch!r} is none of {', '.join(SWITCH_VALUES)}"
    machine = platform.machine()
    if platform.system() != "Linux" or machine not in ("x86_64", "AMD64", "aarch64", "arm64"):
        return None, f"they need Linux on x86-64 or aarch64, this is {platform.system()} {machine}"
    if machine in ("aarch64", "arm64"):
        return ("neon", None) if switch in ("1", "neon") else (None, f"{ENV_SWITCH}={switch} names an x86 ISA")
    if switch == "neon":
        return None, f"{ENV_SWITCH}=neon needs an aarch64 CPU, this is {machine}"
    flags = cpu_flags()
    wanted = {"avx2": ["avx2"], "avx512": ["avx512"], "noamx": ["avx512"]}.get(switch, ["avx512", "avx2"])
    for name in wanted:
        if set(ISAS[name].cpu_flags) <= flags:
            return name, None
    missing = [f for f in ISAS[wanted[-1]].cpu_flags if f not in flags]
    return None, f"this CPU lacks {', '.join(missing)}"


active_ops: Any = None  # ops() of the ISA in use once load() succeeded: a module global, so compiled graphs can read it


def load(which: str | None = None) -> bool:
    """Build (once, cached on disk) and load the library of `which` ISA (default: isa()); never raises."""
    global active_ops
    chosen = isa()
    ready = _load(which or chosen)
    if ready and (which or chosen) == chosen:
        active_ops = getattr(torch.ops, f"chattts_velocity_{chosen}")
    return ready


_build_failures: dict[str, str] = {}  # ISA -> why its library did not build or load


@functools.cache
def _load(which: str | None) -> bool:
    if which is None:
        return False
    try:
        torch.ops.load_library(str(build_library(which, ISAS[which])))  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        _register_fakes(f"chattts_velocity_{which}")
        return True
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        _build_failures[which] = f"building them failed ({str(exc).strip()[-600:]})"
        return False


@functools.cache
def warn_slow_path(mode: str) -> None:
    """Once per precision `mode`: it runs on torch's generic kernels here, why, and what that costs (silent with
    CHATTTS_VELOCITY_CPU_KERNELS=0, which asks for them)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return
    reason = unsupported() or _build_failures.get(isa() or "", "they did not load")
    warnings.warn(f"chattts_velocity: dtype {mode!r} runs on torch's generic CPU kernels here, because our C++ kernels "
                  f"are unavailable: {reason}. Expect about a third of their decode speed (docs/performance.md "
                  f"section 11), and codes that may depend on the batch", RuntimeWarning, stacklevel=3)


@functools.cache
def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith(("flags", "Features"))), "")
    return set(line.partition(":")[2].split())


def _register_fakes(namespace: str) -> None:
    """Output shapes for torch.compile's tracing (the batch dimension stays symbolic)."""
    fakes = {"linear_bf16": _fake_linear_bf16, "linear_int8": _fake_linear_int8, "linear_int8_q8": _fake_linear_int8,
             "linear_int4": _fake_linear_int4, "paged_decode_attention": _fake_attention,
             "head_linear": _fake_head_linear, "sample_rows": _fake_sample_rows}
    for op, fake in fakes.items():
        torch.library.register_fake(f"{namespace}::{op}")(fake)


def _fake_linear_bf16(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0] * weight.shape[2])


def _fake_linear_int8(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], scales.shape[0])


def _fake_linear_int4(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0] * 4)


def _fake_head_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def _fake_sample_rows(logits: torch.Tensor, *rest: object) -> torch.Tensor:
    return logits.new_empty(logits.shape[0], dtype=torch.int64)


def _fake_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(q)


def to_tiles(weight: torch.Tensor, chunk: int) -> torch.Tensor:
    """weight [N, K] -> [N/4, K/chunk, 4, chunk], the layout cpu_linear.cpp streams (N % 4 == K % chunk == 0), on
    huge pages (pages.py)."""
    n, k = weight.shape
    return on_huge_pages(weight.reshape(n // 4, 4, k // chunk, chunk).transpose(1, 2))


def fits_tiles(weight: torch.Tensor, chunk: int) -> bool:
    n, k = weight.shape
    return n % 4 == 0 and k % chunk == 0


def amx_ready() -> bool:
    """True when the AVX-512 kernels are the ones in use and cpu_amx.cpp can run here (AMX-BF16, and Linux granted
    its state), unless CHATTTS_VELOCITY_CPU_KERNELS=noamx asks for the AVX-512 tiles (to test them on an AMX CPU)."""
    if os.environ.get(ENV_SWITCH, "1") == "noamx" or isa() != "avx512":
        return False
    return _amx_granted()


@functools.cache
def _amx_granted() -> bool:
    return load("avx512") and {"amx_tile", "amx_bf16"} <= cpu_flags() and ops("avx512").amx_ready()


def from_panels(panels: torch.Tensor) -> torch.Tensor:
    """The inverse of to_panels: [N/16, K/2, 16, 2] -> [N, K]."""
    n16, k2 = panels.shape[:2]
    return panels.permute(0, 2, 1, 3).reshape(n16 * 16, k2 * 2)


def from_tiles(tiles: torch.Tensor) -> torch.Tensor:
    """The inverse of to_tiles: [N/4, K/chunk, 4, chunk] -> [N, K]."""
    n4, kc, _, chunk = tiles.shape
    return tiles.transpose(1, 2).reshape(n4 * 4, kc * chunk)


def to_panels(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] (bf16 or int8) -> [N/16, K/2, 16, 2], the layout cpu_amx.cpp streams (N % 16 == K % 32 == 0),
    on huge pages (pages.py)."""
    n, k = weight.shape
    return on_huge_pages(weight.reshape(n // 16, 16, k // 2, 2).permute(0, 2, 1, 3))


def fits_panels(weight: torch.Tensor) -> bool:
    n, k = weight.shape
    return n % 16 == 0 and k % 32 == 0
