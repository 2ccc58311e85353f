"""Serving stage on Ray: a Serve driver stops its cluster cleanly on SIGTERM, SIGINT or SIGHUP.

Before, SIGTERM ran Ray's own handler (kill the node's processes, exit) and SIGHUP killed the driver outright; either
way the raylet's agents and the replicas' workers could outlive it. Now every stop signal raises StopRequested in the
main thread, and shutdown_cluster stops Serve, then Ray, then ends whatever the driver started that is still running.
Processes are read from /proc (Linux); elsewhere only serve.shutdown() and ray.shutdown() run.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from types import FrameType

logger = logging.getLogger("chattts_velocity")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
Process = tuple[int, int]  # (pid, start time in clock ticks): a pid alone may be reused once its process has gone


class StopRequested(KeyboardInterrupt):
    """A stop signal arrived; raised in the main thread, so `finally` blocks and shutdown_cluster run."""


def stop_on_signals() -> None:
    """From now on SIGTERM, SIGINT and SIGHUP raise StopRequested (call it after ray.init, which sets its own)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise_stop)


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise StopRequested(signal.Signals(signum).name)


def shutdown_cluster(grace_s: float = 10.0) -> None:
    """serve.shutdown() and ray.shutdown(), then SIGTERM (SIGKILL after grace_s) to any process this driver started
    that is still alive. Stop signals are ignored meanwhile, so a second one cannot cut the cleanup short."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    started = descendants(os.getpid())
    import ray

    if ray.is_initialized():
        from ray import serve

        try:
            serve.shutdown()  # type: ignore[no-untyped-call]  # unannotated in ray
        except Exception as exc:  # noqa: BLE001 -- the cluster may be half gone; Ray's own shutdown still runs
            logger.warning("serve.shutdown failed: %s", exc)
        ray.shutdown()
    left = terminate(started, grace_s)
    if left:
        logger.warning("ray: killed %d process(es) that outlived ray.shutdown()", len(left))


def descendants(pid: int) -> list[Process]:
    """Every living process below `pid` (children, theirs, ...), read from /proc; [] where there is no /proc."""
    parents: dict[int, list[Process]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        stat = _stat(int(entry.name))
        if stat is not None:
            parents.setdefault(stat[0], []).append((int(entry.name), stat[1]))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += [child for child, _ in children]
    return found


def alive(process: Process) -> bool:
    """The process still runs (a zombie has ended: only its exit status is left)."""
    stat = _stat(process[0])
    return stat is not None and stat[1] == process[1] and not stat[2]


def terminate(processes: list[Process], grace_s: float) -> list[Process]:
    """SIGTERM the living ones, SIGKILL those still alive after grace_s; returns the ones that needed SIGTERM."""
    living = [p for p in processes if alive(p)]
    _signal(living, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(alive(p) for p in living) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal([p for p in living if alive(p)], signal.SIGKILL)
    return living


def _signal(processes: list[Process], sig: signal.Signals) -> None:
    for pid, _ in processes:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _stat(pid: int) -> tuple[int, int, bool] | None:
    """(parent pid, start time, is a zombie) from /proc/<pid>/stat, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid ... starttime is field 22
    return int(fields[1]), int(fields[19]), fields[0] == "Z"
