"""benchmarks/render_docs.py: the docs' generated tables equal what the committed JSON renders, and drift shows."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.render_docs import RESULTS, render, stale_documents


def test_docs_match_the_committed_results() -> None:
    assert stale_documents() == [], "run python -m benchmarks.render_docs and commit the docs"


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


def test_steady_decode_leaves_out_the_first_step_and_refuses_waves() -> None:
    from benchmarks.lib.doc_tables_gpu import steady_ms

    one_wave = {"ttft": [0.087, 0.0871], "gpt_seconds": 0.087 + 59 * 0.002, "steps": 60}
    assert steady_ms(one_wave) == pytest.approx(1e3 * (59 * 0.002 - 0.0001) / 59)  # from the last first token
    assert steady_ms({**one_wave, "ttft": [0.03, 0.6]}) is None  # requests started in waves


def test_the_current_gpu_check_layout_names_the_card_in_every_row(tmp_path: Path) -> None:
    from benchmarks.lib.doc_tables_gpu import gpu_check_table, gpu_step_table

    sizes = {"1": 2500.0, "16": 40000.0, "64": 100000.0, "256": 200000.0}
    run = {"device": "NVIDIA H100 80GB HBM3", "dtype": "bfloat16", "steady_steps_per_s": sizes,
           "overlapped_steps_per_s": None, "end_to_end_steps_per_s": {k: v / 2 for k, v in sizes.items()},
           "replay_ms": {"new": {"1": {"100": 0.4, "500": 0.5}}, "old": {"1": {"100": 40.0, "500": 41.0}}},
           "kernels_per_step": {"1": 105, "64": 110}, "max_concurrent": 256, "invariant_alone_vs_63": True,
           "stream64_audio_s_per_s": 1234.5, "ttfa_s": {"1": 0.05, "64": 0.15}}
    (tmp_path / "gpu_check.json").write_text(json.dumps(run))
    rows = gpu_check_table(tmp_path).splitlines()[2:]
    assert len(rows) == 4 + 2 + 5 and all("| NVIDIA H100 80GB HBM3 |" in row for row in rows)
    assert "| 2,500 | not measured | 1,250 |" in rows[0] and "1,234.5" in "".join(rows)
    profile = {"device": "NVIDIA H100 80GB HBM3", "sizes": {"1": {"step_ms_median": 0.5,
               "cprofile_step_ms_median": 0.6, "graph_replay_ms": 0.4}}}
    (tmp_path / "profile_gpu_step.json").write_text(json.dumps(profile))
    assert "| 1 | 0.50 | 0.60 | 0.40 | 20% |" in gpu_step_table(tmp_path)
