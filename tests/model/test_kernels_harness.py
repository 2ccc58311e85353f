"""The torch-free harness of the CPU micro-kernels (kernels_harness.cpp): built and run for aarch64 NEON under
qemu-aarch64 (cross-compiled with aarch64-linux-gnu-g++: plain ARMv8 and with the BF16 / i8mm / dotprod extensions),
natively on an aarch64 host, and natively for the x86 ISAs this CPU runs. Every check is against reference values
computed in double inside the harness."""
from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from chattts_velocity.model import kernels

HARNESS = Path(__file__).with_name("kernels_harness.cpp")
KERNELS = Path(kernels.__file__).parent
CROSS, QEMU = "aarch64-linux-gnu-g++", "qemu-aarch64"
NATIVE_ARM = platform.machine() in ("aarch64", "arm64")
ARM_TARGETS = {"armv8-a": "-march=armv8-a", "armv8.6-a+bf16+i8mm+dotprod": "-march=armv8.6-a+bf16+i8mm+dotprod"}
X86_TARGETS = {isa: [*kernels.ISAS[isa].compiler_flags] for isa in ("avx2", "avx512")}  # the library's own flags


def _build_and_run(compiler: list[str], flags: list[str], tmp_path: Path, runner: list[str]) -> str:
    binary = tmp_path / "harness"
    built = subprocess.run([*compiler, "-O2", "-std=c++17", *flags, f"-I{KERNELS}", str(HARNESS), "-o", str(binary)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    done = subprocess.run([*runner, str(binary)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("all passed"), done.stdout + done.stderr
    return done.stdout


@pytest.mark.skipif(not NATIVE_ARM and not (shutil.which(CROSS) and shutil.which(QEMU)),
                    reason=f"needs an aarch64 host, or {CROSS} and {QEMU} (apt-get install g++-aarch64-linux-gnu "
                           "qemu-user)")
@pytest.mark.parametrize("target", [pytest.param(t, marks=() if NATIVE_ARM else pytest.mark.slow)
                                    for t in ARM_TARGETS])  # cross-built and emulated: the slow suite
def test_neon_micro_kernels_and_paged_attention_match_the_reference(target: str, tmp_path: Path) -> None:
    if NATIVE_ARM:
        out = _build_and_run(["g++"], [ARM_TARGETS[target]], tmp_path, [])
    else:
        out = _build_and_run([CROSS, "-static"], [ARM_TARGETS[target]], tmp_path, [QEMU])
    assert out.count("ok  ") >= 20  # every check ran: helpers, three tile layouts, twelve attention cases


# the ISA this process runs in the default suite, the other one (another cold g++ build) in the slow suite
@pytest.mark.parametrize("isa", [pytest.param(i, marks=() if i == kernels.isa() else pytest.mark.slow)
                                 for i in X86_TARGETS])
def test_x86_micro_kernels_match_the_reference(isa: str, tmp_path: Path) -> None:
    if platform.machine() not in ("x86_64", "AMD64") or not set(kernels.ISAS[isa].cpu_flags) <= kernels.cpu_flags():
        pytest.skip(f"this CPU cannot run the {isa} kernels")
    if not shutil.which("g++"):
        pytest.skip("needs g++")
    _build_and_run(["g++"], X86_TARGETS[isa], tmp_path, [])


@pytest.mark.skipif(not shutil.which("g++") or platform.machine() not in ("x86_64", "AMD64"), reason="needs g++ on x86")
def test_an_isa_header_missing_a_contract_name_fails_to_compile(tmp_path: Path) -> None:
    """isa_contract.h names every piece an ISA header provides: one renamed away is an error there, not only at
    whichever driver happens to use it."""
    for header in KERNELS.glob("*.h"):
        (tmp_path / header.name).write_text(header.read_text(encoding="utf-8"), encoding="utf-8")
    complete = subprocess.run(["g++", "-fsyntax-only", "-std=c++17", *X86_TARGETS["avx2"], f"-I{tmp_path}",
                               str(HARNESS)], capture_output=True, text=True, timeout=120)
    assert complete.returncode == 0, complete.stderr[-2000:]
    header = tmp_path / "isa_avx2.h"
    text = header.read_text(encoding="utf-8")
    assert "void tile_rows_int8(" in text
    header.write_text(text.replace("void tile_rows_int8(", "void tile_rows_int8_renamed("), encoding="utf-8")
    done = subprocess.run(["g++", "-fsyntax-only", "-std=c++17", *X86_TARGETS["avx2"], f"-I{tmp_path}",
                           str(HARNESS)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "isa_contract.h" in done.stderr and "tile_rows_int8" in done.stderr


@pytest.mark.slow
@pytest.mark.skipif(NATIVE_ARM or not shutil.which(CROSS), reason=f"needs {CROSS} on a non-aarch64 host")
def test_the_neon_library_drivers_compile_for_aarch64() -> None:
    """The op drivers (ATen included) compile for aarch64 with this torch's headers: what a native build does."""
    import sysconfig

    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    for source in kernels.DRIVERS:
        done = subprocess.run([CROSS, "-fsyntax-only", "-std=c++17", "-march=armv8.2-a",
                               "-DCV_OPS=chattts_velocity_neon", *includes, str(source)],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
