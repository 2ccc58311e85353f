"""Batch export, files in an output folder someone else may have prepared: opened without following a symbolic link,
only when they are regular files, and never blocking (a FIFO or a device named like an output would hang a plain
open() or read()).

O_NOFOLLOW guards the last component of a path; `check_inside` guards the folders above it (their real path must
stay inside the output folder).
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

SAFE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a folder"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class UnsafeFile(ValueError):
    """A path in the output folder that is not a regular file of its own (a link, FIFO, device, folder)."""


def file_kind(path: Path) -> str | None:
    """None when nothing is there, "a regular file", or what else is there ("a FIFO", ...); never follows a link."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "a regular file" if stat.S_ISREG(mode) else
                "a special file")


def open_regular(path: Path, flags: int, mode: int = 0o644) -> int:
    """os.open(path) for a regular file only: UnsafeFile naming `path` when it is a link or anything else.
    FileNotFoundError passes through (without O_CREAT)."""
    try:
        fd = os.open(path, flags | SAFE_FLAGS, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW met a link (EMLINK on FreeBSD)
            raise unsafe(path, "a symbolic link") from None
        if exc.errno == errno.ENXIO:  # a FIFO with no writer, or a socket
            raise unsafe(path, file_kind(path) or "a special file") from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise unsafe(path, next((kind for test, kind in _KINDS if test(info.st_mode)), "a special file"))
    return fd


def read_regular(path: Path) -> bytes | None:
    """The bytes of a regular file, None when it does not exist; UnsafeFile when it is a link or not a file."""
    try:
        fd = open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def check_inside(folder: Path, path: Path) -> None:
    """UnsafeFile unless the real path of `path`'s folder is `folder` or inside it (no linked folder leads out)."""
    real = Path(os.path.realpath(path.parent))
    if not real.is_relative_to(Path(os.path.realpath(folder))):
        raise UnsafeFile(f"output: {path.parent} leads outside the output folder {folder} (a symbolic link); the "
                         "export writes only inside it")


def unsafe(path: Path, kind: str, field: str | None = None) -> UnsafeFile:
    """The error for a path that is `kind` (a link, a FIFO, ...), naming `field` (default: the file's name)."""
    return UnsafeFile(f"{field or path.name}: {path} is {kind}, not a regular file; the export never opens one there "
                      "(remove it, or choose another output folder)")
