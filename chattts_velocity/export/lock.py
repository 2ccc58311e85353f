"""Batch export, the output folder's lock: one export writes into a folder at a time.

An exclusive `flock` on `<folder>/.export.lock`, taken when the plan is made (before the model loads) and held
until the run ends or the process exits; a second export into the folder, from any process, is a ValueError
naming the holder. Plans of one process share the lock (a re-plan after a run, as the tests and the web UI do).
Taking the lock is also the check that the folder is writable.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no lock (the export still never leaves a partial file)
    fcntl = None  # type: ignore[assignment]  # the module or None: checked before each use

LOCK_NAME = ".export.lock"
_held: dict[Path, list[int]] = {}  # folder -> [fd, plans holding it], in this process
_guard = threading.Lock()


def lock_folder(folder: Path) -> Callable[[], None]:
    """Create `folder` if needed and lock it; returns the release function (idempotent)."""
    folder = _writable_folder(folder)
    with _guard:
        if folder in _held:
            _held[folder][1] += 1
        else:
            _held[folder] = [_take(folder), 1]
    released = False

    def release() -> None:
        nonlocal released
        with _guard:
            if released or folder not in _held:
                return
            released = True
            _held[folder][1] -= 1
            if _held[folder][1] == 0:
                os.close(_held.pop(folder)[0])  # closing the descriptor drops the flock
    return release


def _writable_folder(folder: Path) -> Path:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ValueError(f"output_dir: {folder} is a file, not a folder; give a folder for the WAVs") from None
    except NotADirectoryError:
        raise ValueError(f"output_dir: cannot create {folder} (a part of its path is a file)") from None
    except OSError as exc:
        raise ValueError(f"output_dir: cannot create {folder} ({exc.strerror})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"output_dir: {folder} is not writable; choose a folder you can write to")
    return folder.resolve()


def _take(folder: Path) -> int:
    path = folder / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ValueError(f"output_dir: {folder} is not writable ({exc.strerror}); choose a folder you can write to") \
            from None
    if fcntl is None:
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ValueError(f"output_dir: another export (pid {holder}) is writing into {folder}; wait for it to finish "
                         "or choose another folder") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd
