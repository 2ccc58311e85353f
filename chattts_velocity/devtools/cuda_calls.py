"""Engine checks: count the CUDA API calls of an engine step, on any machine.

On a CPU the engine skips its CUDA branches, so `CudaCalls` counts, while it is active, what each of the project's
host-device hand-offs calls on CUDA (the branch its code takes there), and the aten ops around them:
- graph_replays: StepGraphs._replay (one cudaGraphLaunch); what runs inside it is the graph's, not counted below;
- memcpy_h2d: Staging.send (an event synchronize on the pinned buffer it reuses, as from its third call on, one copy
  from it, an event record) and to_device of a host tensor (a pinned copy, then the copy);
- memcpy_d2h: Readback.start (one non-blocking copy, then an event record; Readback.finish waits on that event,
  its clone is host memory) and every Tensor.cpu() / device-to-host copy or host sync the step makes
  (devtools/sync_detector.py's count), each a synchronous copy on CUDA;
- launches_outside_graph: kernels launched outside the replay (devtools/launch_counter.py's count);
- allocations: tensors made outside the replay and the hand-offs above (aten.empty*, and ops that return a tensor
  in new memory: clone, cat, an elementwise op without out=), host memory and device memory alike (on a CPU they
  are one), plus the pinned buffer each to_device makes.
Inside a replay nothing is counted but its launches (the graph's own, not a CUDA call of the host).
The sum is `total`. With `skip_kernels=True` Triton kernels are counted, not run (launch_counter.py).
"""
from __future__ import annotations

import sys
from collections import Counter
from types import TracebackType
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._python_dispatch import TorchDispatchMode

from chattts_velocity.devtools.launch_counter import FREE_OPS, LaunchCounter
from chattts_velocity.devtools.sync_detector import SyncDetector, in_triton_interpreter

aten = torch.ops.aten
KINDS = ("graph_replays", "memcpy_h2d", "memcpy_d2h", "event_records", "event_syncs", "launches_outside_graph",
         "allocations")
_VIEWS = FREE_OPS - {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided,
                     aten.contiguous}
_ALLOCATING = {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided}


class _Allocations(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's __init_subclass__ is unannotated
    """Counts the ops that return a tensor in memory none of their inputs owned."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # TorchDispatchMode.__init__ is unannotated
        self.count = 0
        self.paused = 0

    def __torch_dispatch__(self, func: OpOverload, types: tuple[type, ...], args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if self.paused or in_triton_interpreter() or func.overloadpacket in _VIEWS:
            return result
        if not isinstance(result, torch.Tensor) or result.numel() == 0:
            return result
        owned = {a.untyped_storage().data_ptr() for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)}
        if func.overloadpacket in _ALLOCATING or result.untyped_storage().data_ptr() not in owned:
            self.count += 1
        return result


class CudaCalls:
    """with CudaCalls() as calls: engine.step()  ->  calls.counts (kind -> count), calls.total."""

    def __init__(self, skip_kernels: bool = False) -> None:
        self.counts: Counter[str] = Counter({kind: 0 for kind in KINDS})
        self.launches = LaunchCounter(skip_kernels=skip_kernels)
        self.syncs = SyncDetector()
        self.allocations = _Allocations()
        self._inside = 0  # launches inside replays (subtracted)
        self._replaying = 0  # > 0 inside a replay: its to_device calls take the graph's device tensors
        self._restore: list[tuple[Any, str, Any]] = []

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __enter__(self) -> CudaCalls:
        from chattts_velocity.engine.worker import overlap, step_inputs
        from chattts_velocity.engine.worker.backends import step_graph

        self._wrap(step_graph.StepGraphs, "_replay", self._replayed)
        self._wrap(step_graph.Staging, "send", self._sent)
        self._wrap(overlap.Readback, "start", self._read_back)
        self._wrap(overlap.Readback, "finish", self._waited, static=True)
        original = step_inputs.to_device
        for module in [m for name, m in sys.modules.items() if name.startswith("chattts_velocity.")]:
            if getattr(module, "to_device", None) is original:
                self._wrap(module, "to_device", self._copied_up, static=True)
        self.launches.__enter__()
        self.syncs.__enter__()
        self.allocations.__enter__()  # type: ignore[no-untyped-call]  # TorchDispatchMode's, unannotated
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.allocations.__exit__(kind, value, tb)  # type: ignore[no-untyped-call]  # unannotated in torch
        self.syncs.__exit__(kind, value, tb)
        self.launches.__exit__(kind, value, tb)
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()
        self.counts["launches_outside_graph"] += self.launches.count - self._inside
        self.counts["memcpy_d2h"] += self.syncs.count
        self.counts["allocations"] += self.allocations.count

    def _wrap(self, owner: Any, name: str, hook: Any, static: bool = False) -> None:
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        self._restore.append((owner, name, original))
        function = original.__func__ if isinstance(original, staticmethod) else original

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return hook(function, *args, **kwargs)

        setattr(owner, name, staticmethod(wrapped) if static and isinstance(owner, type) else wrapped)

    def _replayed(self, run: Any, graphs: Any, *args: Any) -> Any:
        self.counts["graph_replays"] += 1
        self.allocations.paused += 1
        self._replaying += 1
        before = self.launches.count
        try:
            return run(graphs, *args)
        finally:
            self._inside += self.launches.count - before
            self._replaying -= 1
            self.allocations.paused -= 1

    def _sent(self, send: Any, staging: Any, *args: Any) -> Any:
        self.counts.update(memcpy_h2d=1, event_records=1, event_syncs=1)
        return self._quietly(send, staging, *args)  # its copy is the memcpy, not a kernel

    def _read_back(self, start: Any, readback: Any, *args: Any) -> Any:
        self.counts.update(memcpy_d2h=1, event_records=1)
        return self._quietly(start, readback, *args)

    def _waited(self, finish: Any, *args: Any) -> Any:
        self.counts["event_syncs"] += 1
        return self._quietly(finish, *args)  # its clone of the staging buffer is host memory, no CUDA call

    def _copied_up(self, to_device: Any, tensor: torch.Tensor, device: torch.device | str) -> Any:
        if not tensor.is_cuda and not self._replaying:  # on CUDA: a pinned host copy, then the copy up
            self.counts.update(memcpy_h2d=1, allocations=1)
        return self._quietly(to_device, tensor, device)

    def _quietly(self, run: Any, *args: Any) -> Any:
        """run(*args) with its ops uncounted: a hand-off counted as its CUDA calls above."""
        self.allocations.paused += 1
        self.launches.muted += 1
        try:
            return run(*args)
        finally:
            self.launches.muted -= 1
            self.allocations.paused -= 1
