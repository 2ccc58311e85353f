"""`chattts-velocity demo` and `bench` as a new user meets them: the same audio on every run with the same seed, a
`next:` hint that keeps the flags that worked, bench results outside the source tree."""
from __future__ import annotations

from pathlib import Path

import pytest

from chattts_velocity import cli
from chattts_velocity.cli.main import bench_argv

FAST = ["--dtype", "float32", "--max-new-token", "6"]


@pytest.mark.slow
def test_demo_is_reproducible_by_default_and_its_seed_draws_the_speaker(tiny_assets: Path, tmp_path: Path,
                                                                        capsys) -> None:
    def run(out: str, *extra: str) -> list[bytes]:
        cli.main(["demo", "--model", str(tiny_assets), "--out", str(tmp_path / out), *FAST, *extra])
        return [p.read_bytes() for p in sorted((tmp_path / out).glob("*.wav"))]

    first, again, other = run("a"), run("b"), run("c", "--seed", "5")
    assert len(first) == 3 and first == again
    assert other != first
    capsys.readouterr()


def test_demo_tiny_draws_its_speaker_from_its_seed_and_its_hint_keeps_tiny(monkeypatch, tmp_path: Path, capsys,
                                                                            tiny_assets: Path) -> None:
    from chattts_velocity import Chat, demo

    (tmp_path / "demo-tiny").symlink_to(tiny_assets, target_is_directory=True)
    monkeypatch.setattr(demo, "cache_dir", lambda: tmp_path)
    seeds: list[int | None] = []
    draw = Chat.sample_random_speaker
    monkeypatch.setattr(Chat, "sample_random_speaker", lambda self, seed=None: seeds.append(seed) or draw(self, seed))
    cli.main(["demo", "--tiny", "--out", str(tmp_path / "out"), "--seed", "7", *FAST])
    assert seeds == [7]
    hint = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("next:"))
    assert hint.count("--model demo --tiny") == 3


@pytest.mark.parametrize("argv,out", [(["--quick"], "cache"), (["--quick", "--out", "mine"], "mine"),
                                      (["--out=mine"], "mine")])
def test_bench_writes_outside_the_source_tree_unless_out_says(monkeypatch, tmp_path: Path, argv, out) -> None:
    monkeypatch.setenv("CHATTTS_VELOCITY_CACHE", str(tmp_path))
    final = bench_argv(argv)
    if out == "cache":
        assert final[-2:] == ["--out", str(tmp_path / "bench")]
    else:
        assert final == argv


def test_bench_outside_a_checkout_says_it_needs_the_repository(tmp_path: Path) -> None:
    """An installed wheel holds no benchmarks/: one line naming what to do, not a traceback."""
    from chattts_velocity.cli.main import bench_module

    with pytest.raises(SystemExit, match="^bench: needs a source checkout"):
        bench_module(tmp_path)
    assert bench_module().__name__ == "benchmarks.bench_engine"  # this checkout: the package's own module
