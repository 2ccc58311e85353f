"""Which test modules a run can leave unimported: those whose module-level marks make the -m expression false
whatever marks their tests add (tests/conftest.py's pytest_ignore_collect)."""
from __future__ import annotations

import ast
import functools
import itertools
from pathlib import Path


def module_marks(path: Path) -> frozenset[str]:
    """The names of `pytestmark = pytest.mark.X` (or a list of them) at the top level of the module's source."""
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
            return frozenset(_mark_name(v) for v in values) - {""}
    return frozenset()


def _mark_name(node: ast.expr) -> str:  # "e2e" of pytest.mark.e2e or pytest.mark.e2e(...); else ""
    node = node.func if isinstance(node, ast.Call) else node
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
        return node.attr
    return ""


def deselects_every_test(markexpr: str, marks: frozenset[str]) -> bool:
    """Whether `markexpr` is false for every test carrying `marks`, whatever other marks each test adds (every
    combination of the expression's other names is tried); False for anything unusual (a mark's arguments)."""
    if not markexpr:
        return False
    from _pytest.mark.expression import Expression  # pytest's own -m parser (pinned: pytest>=9.2,<10)

    try:
        expression = Expression.compile(markexpr)
    except SyntaxError:
        return False
    others = sorted(expression.idents() - marks)
    if len(others) > 8:
        return False
    for values in itertools.product((False, True), repeat=len(others)):
        present = marks | {name for name, on in zip(others, values, strict=True) if on}
        try:
            if expression.evaluate(functools.partial(_has_mark, present)):
                return False
        except ValueError:
            return False
    return True


def _has_mark(present: frozenset[str], name: str, /, **kwargs: object) -> bool:
    if kwargs:
        raise ValueError(f"{name}: a mark's arguments in -m")
    return name in present
