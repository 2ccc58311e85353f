"""Engine stage, checks: count the kernels a piece of code would launch on a GPU, on any machine.

`LaunchCounter` is a TorchDispatchMode that also wraps Triton's launcher. Inside it, each Triton kernel launch
(compiled, or run by the CPU interpreter under TRITON_INTERPRET=1) counts once, and each aten op that computes
something (not a view, not a bare allocation, not a host-device copy) counts once: what it launches on CUDA,
where a torch op is one kernel (a GEMM, an elementwise op, a reduction) or a few (sort, top-k). Host-device copies
are counted apart (`copies`). Ops issued by Triton's interpreter itself (it runs kernels through numpy) are not
the code's and are skipped. On a GPU, torch.profiler counts the real kernels (benchmarks/gpu_check_parts.py).

    with LaunchCounter() as launches:
        engine.step()
    launches.total, launches.triton.most_common(3), launches.torch.most_common(3)
"""
from __future__ import annotations

import sys
from collections import Counter
from types import FrameType, TracebackType
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
NO_KERNEL = {aten.empty, aten.empty_like, aten.empty_strided, aten.empty_permuted, aten.new_empty,
             aten.new_empty_strided, aten.detach, aten.lift_fresh,
             aten.alias, aten.set_, aten.resize_, aten._local_scalar_dense, aten.is_pinned, aten._pin_memory,
             aten.record_stream, aten.sym_size, aten.sym_stride, aten.sym_numel, aten.sym_storage_offset}
COPY_OPS = {aten._to_copy, aten.copy_, aten._copy_from}


def _interpreter_frame() -> bool:
    """Whether Triton's interpreter (or its launcher) is on the stack: its own tensor ops are not launches."""
    if "triton.runtime.interpreter" not in sys.modules:  # no interpreter loaded: skip the stack walk
        return False
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if "triton" in name and ("interpreter" in name or "runtime" in name):
            return True
        frame = frame.f_back
    return False


def _has_tensor(out: Any) -> bool:
    """Whether an op returned a tensor (scalar ops such as promote_types launch nothing)."""
    return isinstance(out, torch.Tensor) or (isinstance(out, (tuple, list))
                                             and any(isinstance(o, torch.Tensor) for o in out))


def _crosses_devices(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> bool:
    devices = {a.device.type for a in (*args, *kwargs.values(), out) if isinstance(a, torch.Tensor)}
    target = kwargs.get("device")
    if target is not None:
        devices.add(torch.device(target).type)
    return len(devices) > 1


class LaunchCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's __init_subclass__ is unannotated
    """Counts Triton launches (by kernel name) and kernel-launching aten ops (by op) while active."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.triton: Counter[str] = Counter()
        self.torch: Counter[str] = Counter()
        self.copies = 0  # host <-> device copies (memcpy, not kernels); on a CPU-only run these stay 0
        self._restore: list[tuple[Any, Any]] = []

    @property
    def total(self) -> int:
        return sum(self.triton.values()) + sum(self.torch.values())

    def __enter__(self) -> LaunchCounter:
        self._wrap_triton()
        super().__enter__()  # type: ignore[no-untyped-call]
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        super().__exit__(kind, error, trace)  # type: ignore[no-untyped-call]
        for cls, run in self._restore:
            setattr(cls, "run", run)  # noqa: B010 -- restoring the launcher patched in _wrap_triton
        self._restore.clear()

    def __torch_dispatch__(self, func: OpOverload, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        if func.is_view or packet in NO_KERNEL or not _has_tensor(out) or _interpreter_frame():
            return out
        if packet in COPY_OPS and _crosses_devices(args, kwargs, out):
            self.copies += 1
        else:
            self.torch[packet.__name__] += 1
        return out

    def _wrap_triton(self) -> None:
        """Count every launch through Triton's launchers (the compiled one and the interpreter's)."""
        for cls in _triton_launchers():
            original = getattr(cls, "run")  # noqa: B009 -- any launcher class

            def run(kernel: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
                fn = getattr(kernel, "fn", kernel)
                self.triton[getattr(fn, "__name__", repr(fn))] += 1
                return __original(kernel, *args, **kwargs)

            self._restore.append((cls, original))
            setattr(cls, "run", run)  # noqa: B010 -- patched while counting, restored in __exit__


def _triton_launchers() -> list[type]:
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:  # no triton: only torch ops can launch
        return []
    return [JITFunction, InterpretedFunction]
