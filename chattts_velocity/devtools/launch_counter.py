"""Engine checks: count the device launches of a step, on any machine.

`LaunchCounter` counts, while it is active,
- every Triton kernel launch (JITFunction.run on a GPU, InterpretedFunction.run under TRITON_INTERPRET=1);
- every aten op that would run a kernel on a GPU: any op but views, metadata and allocations (a cuBLAS GEMM, a
  cast, an elementwise op, a copy each count one). Ops Triton's interpreter issues itself are not the engine's.
On a CPU engine (the triton backend under the interpreter) the count is what one step launches on a GPU: the
captured graph's kernels plus the eager ones around it. `skip_kernels=True` counts Triton launches without running
them (the interpreter is slow; a step's launches do not depend on the values its kernels write): their float tensors,
and any tensor allocated uninitialised under the counter (a kernel's output, such as the sampled tokens), are zeroed
instead (uncounted), so what follows reads zeros, not uninitialised memory: a token read from it could be EOS and end
the sequences the count was meant to step.
"""
from __future__ import annotations

import weakref
from collections import Counter
from types import TracebackType
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._python_dispatch import TorchDispatchMode

from chattts_velocity.devtools.sync_detector import in_triton_interpreter

aten = torch.ops.aten
# ops that launch nothing on a GPU: views and metadata, allocations (the caching allocator), host-side scalars
FREE_OPS = {aten.view, aten._unsafe_view, aten.reshape, aten.expand, aten.slice, aten.select, aten.unsqueeze,
            aten.squeeze, aten.t, aten.transpose, aten.permute, aten.as_strided, aten.alias, aten.detach,
            aten.unbind, aten.split, aten.split_with_sizes, aten.chunk, aten.narrow, aten.flatten, aten.unflatten,
            aten.view_as, aten.expand_as, aten.empty, aten.empty_like, aten.empty_strided, aten.lift_fresh,
            aten._reshape_alias, aten.contiguous, aten.numpy_T, aten.is_same_size, aten.sym_size, aten.sym_stride,
            aten.sym_numel, aten.sym_storage_offset, aten.is_nonzero, aten.result_type, aten.set_, aten.new_empty,
            aten.new_empty_strided, aten.promote_types, aten.resolve_conj, aten.resolve_neg}


class LaunchCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's __init_subclass__ is unannotated
    """with LaunchCounter() as launches: engine.step()  ->  launches.count, launches.ops (name -> count)."""

    def __init__(self, skip_kernels: bool = False) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # TorchDispatchMode.__init__ is unannotated
        self.ops: Counter[str] = Counter()
        self.skip_kernels = skip_kernels
        self._patched: list[tuple[Any, Any]] = []
        self._depth = 0
        self.muted = 0  # > 0: the counter's own ops (zeroing a skipped kernel's tensors) run uncounted
        # storage data_ptr -> a live tensor that aten.empty* made under the counter
        self._uninitialised: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()

    @property
    def count(self) -> int:
        return sum(self.ops.values())

    @property
    def triton(self) -> int:
        return sum(n for name, n in self.ops.items() if name.startswith("triton."))

    def __enter__(self) -> LaunchCounter:
        if not self._patched:  # the outermost entry (decomposition re-enters the mode)
            for cls in _kernel_classes():
                self._patched.append((cls, cls.run))
                cls.run = self._counting(cls.run)
        self._depth += 1
        super().__enter__()  # type: ignore[no-untyped-call]  # TorchDispatchMode.__enter__ is unannotated
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        super().__exit__(kind, value, tb)  # type: ignore[no-untyped-call]  # unannotated in torch
        self._depth -= 1
        if self._depth == 0:
            for cls, run in reversed(self._patched):
                cls.run = run
            self._patched.clear()

    def _counting(self, run: Any) -> Any:
        counter = self

        def counted(kernel: Any, *args: Any, warmup: bool = False, **kwargs: Any) -> Any:
            if not warmup:
                counter.ops[f"triton.{getattr(kernel, '__name__', 'kernel')}"] += 1
                if counter.skip_kernels:
                    counter.muted += 1
                    try:
                        for arg in (*args, *kwargs.values()):
                            if isinstance(arg, torch.Tensor) and (arg.is_floating_point() or counter._made_empty(arg)):
                                arg.zero_()
                    finally:
                        counter.muted -= 1
                    return None
            return run(kernel, *args, warmup=warmup, **kwargs)

        return counted

    def _made_empty(self, tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() in self._uninitialised

    def __torch_dispatch__(self, func: OpOverload, types: tuple[type, ...], args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if self.muted or in_triton_interpreter():
            return func(*args, **kwargs)
        with self:  # a composite op (linear, to, matmul, ...) counts as the ops it runs: none, one or more
            result = func.decompose(*args, **kwargs)
        if result is not NotImplemented:
            return result
        if func.overloadpacket not in FREE_OPS:
            self.ops[str(func.overloadpacket)] += 1
        result = func(*args, **kwargs)
        if self.skip_kernels and func.overloadpacket in _EMPTY_OPS and isinstance(result, torch.Tensor):
            self._uninitialised[result.untyped_storage().data_ptr()] = result
        return result


_EMPTY_OPS = {aten.empty, aten.empty_strided, aten.empty_like, aten.new_empty, aten.new_empty_strided}


def _kernel_classes() -> list[Any]:
    """The Triton classes whose run() is one kernel launch (none when triton is not installed)."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
    except ImportError:
        return []
    return [JITFunction, InterpretedFunction]
