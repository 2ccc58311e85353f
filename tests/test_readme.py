"""README and docs checks: the Python snippet runs as written (after the README's first command wrote the demo
weights), speed figures name their host kind, file names and paths in the docs are the real ones."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def test_the_python_snippet_runs_as_written(tiny_assets: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    (snippet,) = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), re.S)
    (tmp_path / "demo").symlink_to(tiny_assets, target_is_directory=True)  # what `demo` writes, tiny
    monkeypatch.setenv("CHATTTS_VELOCITY_CACHE", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(snippet.replace("manual_seed=42)", "manual_seed=42, max_new_token=8)"), "README.md", "exec"),
         namespace)
    wavs = namespace["wavs"]
    assert len(wavs) == 2 and all(isinstance(w, np.ndarray) and w.dtype == np.float32 and len(w) for w in wavs)
    printed = capsys.readouterr().out.split()
    assert printed[0] == "0" and printed[2] == "1" and all(p.isdigit() for p in printed)


def test_speed_figures_live_in_the_generated_performance_doc() -> None:
    """The README quotes no speed-up (a copy would drift from benchmarks/results); it points to the doc that
    render_docs.py generates from the JSON instead."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.split(r"\n(?=- |\n)", text)  # paragraphs and bullets
    assert [b[:120] for b in blocks if re.search(r"\b\d+(\.\d+)?x\b", b)] == []
    assert "(docs/performance.md)" in text


def test_serving_doc_shows_the_timestamps_file_export_writes(tmp_path: Path) -> None:
    from chattts_velocity.export import plan_export
    from chattts_velocity.export.run import timestamps_path

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
