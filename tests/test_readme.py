"""README and docs checks: the Python snippet runs as written (after the README's first command wrote the demo
weights), speed figures name their host kind, file names and paths in the docs are the real ones."""
from __future__ import annotations

import re
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from chattts_velocity import demo
from chattts_velocity.demo import DEMO_MAX_NEW_TOKEN
from chattts_velocity.engine.loading.host import decide_here

REPO = Path(__file__).resolve().parents[1]


README_BUDGET_S = 30.0  # what the README promises for its Python block on demo weights on 2 cores
SAMPLES_PER_STEP = 512  # audio samples per code step: a 4-step chunk is 2,048 samples


def run_python_snippet(weights: Path, tmp_path: Path, monkeypatch) -> tuple[dict, float]:
    """The README's Python block, as written, with `weights` where `chattts-velocity demo` writes its own; returns
    (its namespace, its seconds)."""
    (snippet,) = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), re.S)
    (tmp_path / "demo").symlink_to(weights, target_is_directory=True)
    monkeypatch.setattr(demo, "cache_dir", lambda: tmp_path)  # demo_model_dir(); the kernels' cache stays warm
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    start = time.perf_counter()
    exec(compile(snippet, "README.md", "exec"), namespace)
    return namespace, time.perf_counter() - start


def report_budget(seconds: float, record_property) -> None:
    """The time against the README's budget: reported (a shared host's time is noise), not asserted."""
    record_property("readme_python_seconds", round(seconds, 1))
    if seconds > README_BUDGET_S:
        warnings.warn(f"README Python block: {seconds:.1f} s, over its {README_BUDGET_S:.0f} s budget", stacklevel=2)


def check_results(namespace: dict, printed: str, cap: int = DEMO_MAX_NEW_TOKEN) -> None:
    wavs = namespace["wavs"]
    assert len(wavs) == 2 and all(isinstance(w, np.ndarray) and w.dtype == np.float32 and len(w) for w in wavs)
    words = printed.split()
    assert sorted(words[0::2]) == ["0", "1"] and all(p.isdigit() for p in words)  # in the order they finish
    chat = namespace["chat"]
    assert chat.default_use_vllm and chat.dtype == decide_here("auto", device=None).dtype  # the fast engine, as auto
    assert all(len(w) <= cap * SAMPLES_PER_STEP for w in wavs)  # the CLI's demo step cap held


def test_the_python_snippet_runs_as_written(tiny_assets: Path, tmp_path: Path, monkeypatch, capsys,
                                            record_property) -> None:
    """On tiny weights with a smaller demo cap (read from its one place, as the CLI reads it), to stay quick."""
    monkeypatch.setattr(demo, "DEMO_MAX_NEW_TOKEN", 12)
    namespace, seconds = run_python_snippet(tiny_assets, tmp_path, monkeypatch)
    check_results(namespace, capsys.readouterr().out, cap=12)
    report_budget(seconds, record_property)


@pytest.mark.slow
def test_the_python_snippet_on_full_size_demo_weights(full_assets: Path, tmp_path: Path, monkeypatch, capsys,
                                                      record_property) -> None:
    namespace, seconds = run_python_snippet(full_assets, tmp_path, monkeypatch)
    check_results(namespace, capsys.readouterr().out)
    report_budget(seconds, record_property)
    with capsys.disabled():
        print(f"\nREADME Python block on full-size demo weights: {seconds:.1f} s (budget {README_BUDGET_S:.0f} s)")


def test_speed_figures_live_in_the_generated_performance_doc() -> None:
    """The README quotes no speed-up (a copy would drift from benchmarks/results); it points to the doc that
    render_docs.py generates from the JSON instead."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.split(r"\n(?=- |\n)", text)  # paragraphs and bullets
    assert [b[:120] for b in blocks if re.search(r"\b\d+(\.\d+)?x\b", b)] == []
    assert "(docs/performance.md)" in text


def test_serving_doc_shows_the_timestamps_file_export_writes(tmp_path: Path) -> None:
    from chattts_velocity.export import plan_export
    from chattts_velocity.export.local import timestamps_path

    (tmp_path / "lines.txt").write_text("First line.\n", encoding="utf-8")
    plan = plan_export(tmp_path / "lines.txt", tmp_path / "out", seed=1)
    name = timestamps_path(Path(plan.lines[0].output)).name
    assert f"cat out/{name}" in (REPO / "docs" / "serving.md").read_text(encoding="utf-8")


def test_scaling_doc_points_only_inside_the_repository() -> None:
    doc = REPO / "docs" / "scaling.md"
    targets = re.findall(r"\]\(([^)#\s]+)[^)]*\)|`((?:\.\./|\./)[^`\s]+)`", doc.read_text(encoding="utf-8"))
    for link in filter(None, (a or b for a, b in targets)):
        if re.match(r"[a-z]+://", link):
            continue  # a web page, not a file
        path = (doc.parent / link).resolve()
        assert path.is_relative_to(REPO) and path.exists(), link
