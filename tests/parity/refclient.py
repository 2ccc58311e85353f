"""Parity stage, our side: find or build the reference venv and run ref_runner.py in it as a subprocess.

In: task dicts (numpy arrays or tensors allowed anywhere). Out: {task name: {field: array | list | scalar}}.
Never imports ChatTTS, vocos or torchaudio: the reference only ever runs in its own interpreter.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build_ref_venv.sh"
RUNNER = HERE / "ref_runner.py"
MARKER_NAME = ".chattts_ref_ready"  # written by build_ref_venv.sh once the venv is complete
BUILD_ENV = "CHATTTS_REF_BUILD"  # "0" = never build: use an existing venv or report it unavailable


class RefUnavailable(RuntimeError):
    """The reference venv does not exist and building it is disabled."""


def ref_venv_dir() -> Path:
    return Path(os.environ.get("CHATTTS_REF_VENV") or Path.home() / ".cache" / "chattts_velocity" / "ref-venv")


def ensure_ref_venv(build: bool | None = None) -> Path:
    """The reference interpreter, building the venv first unless disabled (CHATTTS_REF_BUILD=0)."""
    venv = ref_venv_dir()
    python = venv / "bin" / "python"
    if build is None:
        build = os.environ.get(BUILD_ENV, "1") != "0"
    if not build:
        if (venv / MARKER_NAME).is_file() and python.is_file():
            return python
        raise RefUnavailable(f"reference venv {venv} is not built and {BUILD_ENV}=0 forbids building it; "
                             f"run `bash {BUILD_SCRIPT}` or unset {BUILD_ENV}")
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          env={**os.environ, "CHATTTS_REF_VENV": str(venv)}, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"building the reference venv failed (exit {done.returncode}):\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return python


def _stash_arrays(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    """Replace arrays/tensors inside a task by {"$array": key} and collect them for inputs.npz."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        key = f"a{len(arrays)}"
        arrays[key] = value
        return {"$array": key}
    if isinstance(value, dict):
        return {k: _stash_arrays(v, arrays) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_stash_arrays(v, arrays) for v in value]
    return value


def _nest(flat: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """"task/field" -> array, "task/field/i" -> list element i; 0-d arrays become Python scalars."""
    out: dict[str, dict[str, Any]] = {}
    lists: dict[tuple[str, str], dict[int, np.ndarray]] = {}
    for key, value in flat.items():
        task, field, *index = key.split("/")
        if index:
            lists.setdefault((task, field), {})[int(index[0])] = value
        else:
            out.setdefault(task, {})[field] = value.item() if value.ndim == 0 else value
    for (task, field), items in lists.items():
        out.setdefault(task, {})[field] = [items[i] for i in range(len(items))]
    return out


@dataclass(frozen=True)
class RefClient:
    """Runs batches of reference tasks; one subprocess (one model load) per run() call."""

    python: Path
    threads: int = 1

    def run(self, tasks: list[dict[str, Any]], asset_root: str | Path | None = None, size: str = "tiny",
            timeout: float = 1800.0) -> dict[str, dict[str, Any]]:
        """Execute `tasks` (see ref_runner's docstring for kinds and fields); raise RuntimeError on failure."""
        names = [t.get("name") for t in tasks]
        if len(set(names)) != len(names) or None in names:
            raise ValueError(f"tasks: every task needs a unique 'name', got {names}")
        if size not in ("tiny", "full"):
            raise ValueError(f"size: expected 'tiny' or 'full', got {size!r}")
        with tempfile.TemporaryDirectory(prefix="chattts_ref_") as tmp:
            arrays: dict[str, np.ndarray] = {}
            request = {"asset_root": str(asset_root) if asset_root else None, "size": size,
                       "tasks": _stash_arrays(tasks, arrays)}
            if arrays:
                request["inputs"] = str(Path(tmp) / "inputs.npz")
                np.savez(request["inputs"], **arrays)
            (Path(tmp) / "request.json").write_text(json.dumps(request), encoding="utf-8")
            out_path = Path(tmp) / "out.npz"
            self._call([str(Path(tmp) / "request.json"), str(out_path)], timeout)
            with np.load(out_path, allow_pickle=False) as flat:
                return _nest({k: flat[k] for k in flat.files})

    def _call(self, args: list[str], timeout: float) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        threads = str(self.threads)
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, CHATTTS_REF_THREADS=threads,
                   TOKENIZERS_PARALLELISM="false", PYTHONNOUSERSITE="1")
        done = subprocess.run([str(self.python), str(RUNNER), *args], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, env=env, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"reference runner failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
