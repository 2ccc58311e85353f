"""Every module, script and result file the README and docs name exists (docs drift when code moves)."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md",
        REPO / "models" / "README.md"]
ROOTS = [REPO, REPO / "chattts_velocity", REPO / "benchmarks", REPO / "tests", REPO / "webui"]
FILE = re.compile(r"`([A-Za-z0-9_./-]+\.(?:py|sh|h|cpp|json))`")
MODULE = re.compile(r"\bchattts_velocity(?:\.[a-z_0-9]+)+")
NOT_OURS = {"gpt/config.json", "manifest.json", "config.json",  # the model's files and the export's output
            "torch/library.h"}  # torch's header (in a venv, which a clone need not hold)


def named_files(text: str) -> set[str]:
    return {m for m in FILE.findall(text) if m not in NOT_OURS and "NAME" not in m and "<" not in m
            and not m.endswith(".timestamps.json") and (not m.endswith(".json") or "results/" in m)}


def exists(name: str) -> bool:
    if "/" in name:
        return any((root / name).exists() for root in ROOTS) or any(REPO.rglob(name))
    return any(p for p in REPO.rglob(name) if ".venv" not in p.parts and ".git" not in p.parts)


def module_exists(dotted: str) -> bool:
    """A dotted name is a module, a package, or a name its source defines (chattts_velocity.schema.Prompt)."""
    parts = dotted.split(".")
    for n in range(len(parts), 1, -1):
        path = REPO.joinpath(*parts[:n])
        source = path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py"
        if source.exists():
            rest = parts[n:]
            return not rest or (len(rest) == 1 and re.search(rf"\b{rest[0]}\b", source.read_text()) is not None)
    return False


def test_every_file_the_docs_name_exists() -> None:
    missing = [f"{doc.relative_to(REPO)}: {name}" for doc in DOCS if doc.exists()
               for name in sorted(named_files(doc.read_text())) if not exists(name)]
    assert missing == []


def test_every_module_the_docs_name_exists() -> None:
    missing = [f"{doc.relative_to(REPO)}: {name}" for doc in DOCS if doc.exists()
               for name in sorted(set(MODULE.findall(doc.read_text()))) if not module_exists(name)]
    assert missing == []
