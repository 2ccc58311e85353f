"""The README's Python snippet runs as written (after the README's first command wrote the demo weights)."""
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


def test_every_speed_figure_names_the_host_kind_it_was_measured_on() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.split(r"\n(?=- |\n)", text)  # paragraphs and bullets
    with_figures = [b for b in blocks if re.search(r"\b\d+(\.\d+)?x\b", b)]
    assert with_figures  # the README quotes its speed-ups
    for block in with_figures:
        assert "AVX-512 BF16" in block, block[:120]
