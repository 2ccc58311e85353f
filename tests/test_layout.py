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


def resolve(target: str, modules: set[str]) -> str | None:
    """The module of ours that importing `target` runs last (`a.b.name` -> `a.b` when `name` is not a module)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def imports(path: Path, modules: set[str]) -> set[str]:
    """Modules of ours that `path` imports anywhere: top level, inside functions, under `if TYPE_CHECKING:`.

    `from pkg import name` counts pkg.name when that is a module, else pkg itself (its __init__), so importing a
    package's re-exports counts as importing the package.
    """
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]) if node.level \
                else node.module or ""
            base = base.strip(".")
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        found |= {m for t in targets if (m := resolve(t, modules)) and m != name}
    return found


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """Pairs (a, b) with a path a -> b and a path b -> a."""
    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                if nxt == goal:
                    return True
                seen.add(nxt)
                todo.append(nxt)
        return False

    return sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if reaches(b, a)})


def module_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in SOURCES}
    return {m: imports(p, set(modules)) for m, p in modules.items()}


def folder(module: str) -> str:
    """The unit a module belongs to: a folder of the package (chattts_velocity.speech), a root module
    (chattts_velocity.chat), the package's own __init__ (chattts_velocity), or webui. engine/'s rooms are units of
    their own (chattts_velocity.engine.sched), and so is each module at engine's top
    (the callers' surface, the loop)."""
    parts = module.split(".")
    if parts[0] != "chattts_velocity":
        return parts[0]
    return ".".join(parts[:3]) if parts[1:2] == ["engine"] else ".".join(parts[:2])


def test_no_import_cycles_between_modules() -> None:
    assert cycles(module_graph()) == []


def test_no_import_cycles_between_folders() -> None:
    """chat -> speech/calls.py and serve/service.py -> chat is a cycle of concepts even when no module cycles."""
    graph: dict[str, set[str]] = {}
    for module, targets in module_graph().items():
        graph.setdefault(folder(module), set()).update(folder(t) for t in targets if folder(t) != folder(module))
    assert cycles(graph) == []


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def private_names_defined(tree: ast.AST) -> set[str]:
    """Private functions, classes, variables and attributes (`self._x = ...`, dataclass fields) a tree defines."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            found.add(node.attr)
    return {n for n in found if is_private(n)}


def held_by_self(node: ast.expr) -> bool:
    """`self.a.b`: an object reached through self's attributes."""
    if not isinstance(node, ast.Attribute):
        return False
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


class PrivateReaches(ast.NodeVisitor):
    """`x._name` outside a class that defines `_name` (x not self or cls), and `from module import _name`."""

    def __init__(self) -> None:
        self.class_names: list[set[str]] = []
        self.found: list[tuple[int, str]] = []

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.class_names.append(private_names_defined(node))
        self.generic_visit(node)
        self.class_names.pop()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        # another instance of the class being defined (`other._x`), not an object self holds (`self.service._x`)
        own_class = any(node.attr in names for names in self.class_names) and not held_by_self(node.value)
        if is_private(node.attr) and not on_self and not own_class:
            self.found.append((node.lineno, node.attr))
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.found += [(node.lineno, a.name) for a in node.names if is_private(a.name)]


def our_module(name: str) -> bool:
    return name.split(".")[0] in ("chattts_velocity", "webui")


def module_reaches(tree: ast.AST, modules: set[str]) -> list[tuple[int, str]]:
    """`module._name` where `module` is bound to one of our modules, and `from our.module import _name`."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and our_module(node.module):
            bound |= {a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in modules}
        elif isinstance(node, ast.Import):
            bound |= {a.asname for a in node.names if a.asname and a.name in modules}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr) and isinstance(node.value, ast.Name) \
                and node.value.id in bound:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module and our_module(node.module))):
            found += [(node.lineno, a.name) for a in node.names if is_private(a.name)]
    return found


def test_no_package_code_reaches_into_another_modules_or_objects_private_names() -> None:
    """`kernels._unsupported()` from another module, `self.service._keys` from another class, `from x import _y`:
    a private name of ours used where it is not defined. Other libraries' private names are theirs."""
    trees = {p: ast.parse(p.read_text()) for p in SOURCES}
    ours = set().union(*map(private_names_defined, trees.values()))
    found = []
    for path, tree in trees.items():
        visitor = PrivateReaches()
        visitor.visit(tree)
        found += [f"{path.relative_to(REPO)}:{line} {name}" for line, name in visitor.found if name in ours]
    assert found == []


def test_no_test_calls_a_modules_private_names() -> None:
    """Tests use the package's public names (`kernels.unsupported()`, not `kernels._unsupported()`); white-box
    checks of an object's own state (`manager._free`) are allowed: a test cannot always tell whose object it holds."""
    modules = {module_name(p) for p in SOURCES}
    found = [f"{p.relative_to(REPO)}:{line} {name}" for p in sorted((REPO / "tests").rglob("*.py"))
             for line, name in module_reaches(ast.parse(p.read_text()), modules)]
    assert found == []


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


def test_no_engine_room_holds_more_than_ten_modules() -> None:
    crowded = {}
    engine = REPO / "chattts_velocity" / "engine"
    for room in (engine, *(p for p in engine.rglob("*") if p.is_dir() and p.name != "__pycache__")):
        modules = [m for m in room.glob("*.py") if m.name != "__init__.py"]
        if len(modules) > 10:
            crowded[str(room.relative_to(REPO))] = len(modules)
    assert crowded == {}


def test_the_runtime_never_imports_the_development_tools() -> None:
    graph = module_graph()
    found = sorted(f"{m} -> {t}" for m, targets in graph.items() if not m.startswith("chattts_velocity.devtools")
                   for t in targets if t.startswith("chattts_velocity.devtools"))
    assert found == []


def test_no_module_file_name_repeats_across_package_folders() -> None:
    """A file's name says what it holds wherever it sits: two folders' `pipeline.py` leave a reader asking which.
    `__init__.py` and `__main__.py` are Python's names for a package and its `python -m` entry."""
    by_name: dict[str, list[str]] = {}
    for path in (REPO / "chattts_velocity").rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            by_name.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1} == {}


ENGINE = "chattts_velocity.engine"
# engine/'s rooms and what each may import inside engine/: the scheduler's bookkeeping nothing, the worker only the
# scheduler's hand-off types, the beams between them; none of them the loop or the callers' surface at engine's top.
ENGINE_ROOMS = {"sched": {"sched"}, "worker": {"sched", "worker"}, "beams": {"sched", "worker", "beams"},
                "loading": {"loading"}}


def test_engine_rooms_import_in_the_direction_the_data_flows() -> None:
    """sched <- worker <- beams <- the loop (llm_engine.py) <- the surface; never back."""
    found = []
    for module, targets in module_graph().items():
        room = module.removeprefix(ENGINE + ".").split(".")[0]
        if not module.startswith(ENGINE + ".") or room not in ENGINE_ROOMS:
            continue
        for target in targets:
            if target.startswith(ENGINE) and (target == ENGINE or target.split(".")[2] not in ENGINE_ROOMS[room]):
                found.append(f"{module} -> {target}")
    assert found == []


def test_no_test_file_name_repeats_across_test_folders() -> None:
    """The test folders are not packages, so pytest imports each file by its base name: two `test_x.py` in two
    folders make the second one a collection error."""
    by_name: dict[str, list[str]] = {}
    for path in (REPO / "tests").rglob("test_*.py"):
        by_name.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1} == {}


PKG = "chattts_velocity"
SHARED_ROOT = {f"{PKG}.{m}" for m in ("schema", "config", "precision", "assets")}
STAGES = ("model", "text", "audio")


def our_imports(source: str) -> set[tuple[str, str]]:
    """(module, target) for every import from the folder `source` (a dotted prefix) to a module outside it."""
    return {(m, t) for m, targets in module_graph().items() if m == source or m.startswith(source + ".")
            for t in targets if not (t == source or t.startswith(source + "."))}


def test_the_stages_import_nothing_from_each_other_but_the_cpu_kernels() -> None:
    """docs/architecture.md, "Boundaries": model/, text/ and audio/ import nothing from each other, except that
    audio/'s C++ decode paths (cpu_decode.py, cpu_panels.py) run on model/kernels (the package's C++ CPU kernels)."""
    crossing = sorted((m, t) for stage in STAGES for m, t in our_imports(f"{PKG}.{stage}")
                      if t.split(".")[1] in STAGES)
    assert crossing and {t for _, t in crossing} == {f"{PKG}.model.kernels"}
    assert {m.rpartition(".")[2] for m, _ in crossing} <= {"cpu_decode", "cpu_panels"}


def test_the_stages_and_the_engine_share_only_the_spine() -> None:
    """model/, text/, audio/ and engine/ import from the root only schema, config, precision and assets; engine/
    imports model/ and none of text/, audio/ or the features around them."""
    found = sorted(f"{m} -> {t}" for stage in (*STAGES, "engine") for m, t in our_imports(f"{PKG}.{stage}")
                   if t.split(".")[1:2] != ["model"] and t not in SHARED_ROOT)
    assert found == []


def test_speech_never_imports_chat_and_the_page_never_imports_the_cli() -> None:
    found = sorted(f"{m} -> {t}" for m, t in our_imports(f"{PKG}.speech") | our_imports("webui")
                   if t == f"{PKG}.chat" or t.startswith(f"{PKG}.cli"))
    assert found == []
