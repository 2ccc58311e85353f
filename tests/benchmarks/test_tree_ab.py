"""benchmarks/tree_ab.py: the two-tree A/B harness (ratios per pair, one fresh process per measurement)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import tree_ab

REPO = Path(__file__).resolve().parents[2]


def test_the_ratio_is_the_median_of_the_per_pair_ratios() -> None:
    old = [{"1": 10.0, "8": 80.0}, {"1": 20.0, "8": 80.0}, {"1": 10.0, "8": 40.0}]
    new = [{"1": 11.0, "8": 40.0}, {"1": 30.0, "8": 80.0}, {"1": 15.0, "8": 80.0}]
    result = tree_ab.compare(old, new)
    assert result["1"]["ratio_new_over_old"] == pytest.approx(1.5)  # per pair 1.1, 1.5, 1.5
    assert result["8"]["ratio_new_over_old"] == pytest.approx(1.0)  # per pair 0.5, 1.0, 2.0
    assert result["8"]["old"] == [80.0, 80.0, 40.0]


def test_trees_alternate_and_each_keeps_its_own_results_even_when_named_alike() -> None:
    calls = iter(range(6))
    runs = tree_ab.interleaved(["a", "a"], 3, lambda tree: (tree, next(calls)))
    assert runs == [[("a", 0), ("a", 2), ("a", 4)], [("a", 1), ("a", 3), ("a", 5)]]


def test_same_output_needs_every_run_of_both_trees_to_agree() -> None:
    runs = [{"1": "x", "8": "y"}, {"1": "x", "8": "y"}, {"1": "x", "8": "z"}]
    assert tree_ab.same_outputs(runs) == {"1": True, "8": False}


def test_a_case_that_fails_in_one_tree_names_the_tree(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="failed in"):
        tree_ab.main(["--trees", str(tmp_path), str(tmp_path), "--model", str(tmp_path / "missing"),
                      "--sizes", "1", "--steps", "2", "--pairs", "1"])


@pytest.mark.slow
def test_one_tree_against_itself_gives_a_ratio_near_one(tiny_assets: Path, tmp_path: Path) -> None:
    out = tmp_path / "ab.json"
    tree_ab.main(["--trees", str(REPO), str(REPO), "--model", str(tiny_assets), "--case", "gpt", "--dtypes",
                  "float32", "--sizes", "1,2", "--steps", "6", "--pairs", "1", "--out", str(out)])
    report = json.loads(out.read_text())
    assert set(report["results"]["float32"]) == {"1", "2"}
    assert 0.2 < report["results"]["float32"]["2"]["ratio_new_over_old"] < 5
    assert report["results"]["float32"]["2"]["same_output"]  # seeded requests: the same codes in every run


@pytest.mark.slow
def test_the_kernels_case_needs_no_model_and_times_each_layout(tmp_path: Path) -> None:
    from chattts_velocity.model import kernels

    if kernels.unsupported() is not None:
        pytest.skip(f"CPU kernels unsupported here: {kernels.unsupported()}")
    out = tmp_path / "kernels.json"
    tree_ab.main(["--trees", str(REPO), str(REPO), "--case", "kernels", "--dtypes", "int8", "--sizes", "1",
                  "--pairs", "1", "--out", str(out)])
    cells = json.loads(out.read_text())["results"]["int8"]
    assert "tiles, 1 rows" in cells and set(cells) <= {"tiles, 1 rows", "amx, 1 rows"}
    assert all(cell["same_output"] and cell["old"][0] > 0 for cell in cells.values())


def test_a_model_is_required_where_the_case_loads_one() -> None:
    with pytest.raises(SystemExit):
        tree_ab.main(["--trees", ".", ".", "--case", "gpt"])
