"""Batch export, the output folder's lock: one export writes into a folder at a time.

An exclusive `flock` on `<folder>/.export.lock`, taken when the plan is made (before the model loads) and held
until the run ends or the process exits; a second export into the folder, from any process, is a ValueError
naming the holder. Plans of one process share the lock (a re-plan after a run, as the tests and the web UI do).
Taking the lock is also the check that the folder is writable. The lock file is opened as a regular file only (a
symbolic link or a FIFO there is a ValueError, never written through) and removed when the last plan releases it.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from .safe_files import UnsafeFile, open_regular

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
                _drop(folder, _held.pop(folder)[0])
    return release


def _drop(folder: Path, fd: int) -> None:
    """Remove the lock file (while still holding it, so no other export holds it then) and close it."""
    path = folder / LOCK_NAME
    try:
        if _same_file(path, fd):
            path.unlink()
    except OSError:
        pass  # a folder gone or made read-only meanwhile: the lock still ends with the descriptor
    os.close(fd)  # closing the descriptor drops the flock


def _same_file(path: Path, fd: int) -> bool:
    try:
        on_disk, held = os.lstat(path), os.fstat(fd)
    except OSError:
        return False
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)


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
    """The locked descriptor. A holder that ends removes the file, so a lock taken on a file that is no longer the
    one at the path (removed between our open and our flock) is let go and taken again on the new one."""
    for _ in range(100):
        fd = _open_lock(folder)
        if fcntl is None:
            return fd
        _flock(folder, fd)
        if _same_file(folder / LOCK_NAME, fd):
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            return fd
        os.close(fd)
    raise ValueError(f"output_dir: the lock file of {folder} keeps changing; is another export starting and ending "
                     "there in a loop?")


def _open_lock(folder: Path) -> int:
    try:
        return open_regular(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    except UnsafeFile as exc:
        raise ValueError(f"output_dir: {exc}") from None
    except OSError as exc:
        raise ValueError(f"output_dir: {folder} is not writable ({exc.strerror}); choose a folder you can write to") \
            from None


def _flock(folder: Path, fd: int) -> None:
    assert fcntl is not None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise ValueError(f"output_dir: another export (pid {holder}) is writing into {folder}; wait for it to finish "
                         "or choose another folder") from None
