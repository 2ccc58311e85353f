"""benchmarks/render_docs.py: the docs' generated tables equal what the committed JSON renders, and drift shows."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.render_docs import RESULTS, render, stale_documents


def test_docs_match_the_committed_results() -> None:
    assert stale_documents() == [], "run python benchmarks/render_docs.py and commit the docs"


def test_a_changed_result_changes_its_table(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    doc = "<!-- generated: kv-int8 -->\nold text\n<!-- end -->\n"
    before = render(doc, results)
    run = json.loads((results / "kv_int8.json").read_text())
    run["threads"]["1"]["int8_speedup"] = 9.87
    (results / "kv_int8.json").write_text(json.dumps(run))
    after = render(doc, results)
    assert "old text" not in before and "**9.87x**" in after and "**9.87x**" not in before


def test_an_unknown_block_is_refused() -> None:
    with pytest.raises(ValueError, match="no-such-table"):
        render("<!-- generated: no-such-table -->\n<!-- end -->\n")
