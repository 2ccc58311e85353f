"""Install rules: CI installs exactly the README's command, and [all] holds every other extra but [bench]."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def extras() -> dict[str, list[str]]:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def test_all_extra_holds_every_other_extra() -> None:
    table = extras()
    (self_ref,) = table["all"]
    named = set(re.fullmatch(r"chattts_velocity\[([a-z,]+)\]", self_ref).group(1).split(","))
    assert named == set(table) - {"all", "bench"}  # bench compiles llama.cpp: benchmarks only, never CI


def test_bench_extra_holds_the_llamacpp_comparison() -> None:
    names = {re.match(r"[A-Za-z0-9_.-]+", req).group(0) for req in extras()["bench"]}
    assert names == {"llama-cpp-python", "gguf"}


def test_ci_installs_the_readme_command() -> None:
    readme_install = re.search(r"pip install (torch==\S+ -e \"\.\[\w+\]\")", (REPO / "README.md").read_text())
    ci_installs = re.findall(r"^pip install -q (.+?) 2>&1", (REPO / ".ci/run").read_text(), re.M)
    assert readme_install is not None and ci_installs == [readme_install.group(1)]
    assert not (REPO / ".ci/constraints.txt").exists()


def test_a_wheel_ships_every_kernel_source_and_header() -> None:
    """The C++ kernels compile on the user's machine (kernels.load), so a non-editable install needs them all."""
    import fnmatch

    tomllib = pytest.importorskip("tomllib")
    with open(REPO / "pyproject.toml", "rb") as f:
        patterns = tomllib.load(f)["tool"]["setuptools"]["package-data"]["chattts_velocity.model.kernels"]
    from chattts_velocity.model import kernels

    sources = {path.name for path in [*kernels.DRIVERS, *kernels.HEADERS]}
    sources |= {name for isa in kernels.ISAS.values() for name in isa.extra_sources}
    assert sources and all(any(fnmatch.fnmatch(name, p) for p in patterns) for name in sources), sources
