"""tests/conftest.py's collection shortcut (tests/mark_filter.py): a test module is left unimported only when its
module-level marks make the -m expression false whatever marks its tests add; everything else is collected."""
from __future__ import annotations

from pathlib import Path

import pytest
from mark_filter import deselects_every_test, module_marks

DEFAULT = "not slow and not parity and not e2e and not triton"  # pyproject's addopts


@pytest.mark.parametrize("expr,marks,left_out", [
    (DEFAULT, {"e2e"}, True),
    (DEFAULT, {"triton", "skipif"}, True),
    (DEFAULT, {"e2e", "slow"}, True),
    (DEFAULT, {"skipif"}, False),
    (DEFAULT, {"gpu"}, False),
    ("e2e", {"e2e"}, False),
    ("e2e and not slow", {"e2e", "slow"}, True),
    ("not e2e or gpu", {"e2e"}, False),  # a test of the module marked gpu is selected
    ("slow or triton", {"e2e"}, False),
    ("", {"e2e"}, False),  # no expression: every test runs
    ("e2e(reason='x')", {"e2e"}, False),  # a mark's arguments: not worked out here, so collected
])
def test_a_module_is_left_out_only_when_none_of_its_tests_can_match(expr: str, marks: set[str],
                                                                       left_out: bool) -> None:
    assert deselects_every_test(expr, frozenset(marks)) is left_out


def test_module_marks_are_read_from_the_top_level_assignment(tmp_path: Path) -> None:
    listed = tmp_path / "test_listed.py"
    listed.write_text("import pytest\npytestmark = [pytest.mark.e2e, pytest.mark.skipif(True, reason='x')]\n")
    single = tmp_path / "test_single.py"
    single.write_text("import pytest\npytestmark = pytest.mark.parity\n")
    nested = tmp_path / "test_nested.py"
    nested.write_text("import pytest\ndef f():\n    pytestmark = pytest.mark.e2e\n")
    broken = tmp_path / "test_broken.py"
    broken.write_text("pytestmark = pytest.mark.e2e(\n")
    assert module_marks(listed) == {"e2e", "skipif"}
    assert module_marks(single) == {"parity"}
    assert module_marks(nested) == frozenset() and module_marks(broken) == frozenset()

