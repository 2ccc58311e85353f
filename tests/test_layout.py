"""The package's shape (docs/architecture.md, "Seams"): a small root, no import cycles, no private reach-ins."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for d in ("chattts_velocity", "webui") for p in (REPO / d).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """Modules of ours that `path` imports anywhere (top level or inside functions), packages' __init__ excluded."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]) if node.level \
                else node.module or ""
            targets = [base.strip(".")] + [f"{base.strip('.')}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and not (REPO / target.replace(".", "/") / "__init__.py").exists():
                found.add(target)
    return found


def test_no_import_cycles() -> None:
    modules = {module_name(p): p for p in SOURCES}
    graph = {m: imports(p, set(modules)) for m, p in modules.items()}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                if nxt == goal:
                    return True
                seen.add(nxt)
                todo.append(nxt)
        return False

    cycles = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if reaches(b, a)})
    assert cycles == []


def test_the_root_holds_only_the_spine() -> None:
    root = sorted(p.name for p in (REPO / "chattts_velocity").glob("*.py"))
    assert len(root) <= 8, root


def test_nothing_outside_chat_reaches_into_private_members() -> None:
    reach_in = re.compile(r"\b(chat|self\.chat|gpt|llm|engine)\._[a-z]\w*\(")
    found = [f"{p.relative_to(REPO)}:{i}" for p in SOURCES if p.name != "chat.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if reach_in.search(line)]
    assert found == []


def test_no_code_asks_which_gpt_backend_it_holds() -> None:
    asks = [f"{p.relative_to(REPO)}:{i}" for p in SOURCES
            for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\.is_vllm\b|\"is_vllm\"", line)]
    assert asks == []


def test_package_files_stay_under_300_lines() -> None:
    big = [f"{p.relative_to(REPO)} ({n})" for p in SOURCES if (n := p.read_text().count("\n")) > 300]
    assert big == []
