"""`chattts-velocity webui`: the command owns the flags and the loading; webui/ is the page and imports no CLI."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from chattts_velocity import cli
from chattts_velocity.demo import DEMO_MAX_NEW_TOKEN

REPO = Path(__file__).resolve().parents[2]


def test_the_page_imports_nothing_from_the_command_line() -> None:
    found = []
    for path in sorted((REPO / "webui").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found += [f"{path.name}: {n}" for n in names if n.startswith("chattts_velocity.cli")]
    assert found == []


def test_the_command_builds_the_page_from_its_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gradio")
    from chattts_velocity.cli import webui as cli_webui
    from webui import app

    built, launched = [], []
    monkeypatch.setattr(cli_webui, "load_chat", lambda args, use_vllm: SimpleNamespace(pipeline=("pipeline", use_vllm)))
    monkeypatch.setattr(cli_webui, "check_port_free", lambda host, port: None)
    monkeypatch.setattr(app, "build_ui", lambda pipeline, **kw: built.append((pipeline, kw)) or "page")
    monkeypatch.setattr(app, "launch", lambda page, **kw: launched.append((page, kw)))
    cli.main(["webui", "--model", "demo", "--plain", "--port", "7999", "--share"])
    ((pipeline, options),) = built
    assert pipeline == ("pipeline", False) and options["gpt"] == "plain"  # the loaded Chat's pipeline
    assert options["max_new_token"] == DEMO_MAX_NEW_TOKEN and options["demo_weights"] is True
    assert not {"max_chars", "queue_size", "files_ttl_s"} & set(options)  # the page's own defaults
    cli.main(["webui", "--model", "demo", "--max-chars", "900", "--queue-size", "3", "--files-ttl", "60"])
    assert (built[1][1]["max_chars"], built[1][1]["queue_size"], built[1][1]["files_ttl_s"]) == (900, 3, 60)
    with pytest.raises(SystemExit, match="--queue-size: must be at least 1"):
        cli.main(["webui", "--model", "demo", "--queue-size", "0"])
    assert launched[0] == ("page", {"host": "127.0.0.1", "port": 7999, "share": True})


def test_the_script_runs_the_webui_command() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script makes its checkout importable
    done = subprocess.run([sys.executable, str(REPO / "webui" / "app.py"), "--help"], capture_output=True,
                          text=True, timeout=120, cwd="/", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: chattts-velocity webui") and "--voices" in done.stdout
