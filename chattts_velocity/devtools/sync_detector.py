"""Engine stage, checks: count what would make a CUDA host wait for the device, on any machine.

`SyncDetector` is a TorchDispatchMode: every aten op run inside it is looked at, on CPU tensors too, so the count
is the same under Triton's CPU interpreter as on a GPU. It counts
- ops whose result size or value the host needs: nonzero, item/_local_scalar_dense (bool(t), int(t)),
  masked_select, boolean-mask indexing (index / index_put with bool indices), repeat_interleave without
  output_size, unique;
- device-to-host copies: a copy from a CUDA tensor to the CPU (on a GPU), and every Tensor.cpu() call (on CPU,
  where no tensor is on a device, each .cpu() stands for the copy it would be there).
Ops issued by Triton's interpreter itself (it runs kernels through numpy) are not the engine's and are skipped.
Python-level reads that dispatch nothing on CPU (Tensor.tolist / numpy of a CUDA tensor) are not seen here; on a GPU,
torch.cuda.set_sync_debug_mode("error") catches them (tests/engine/test_sync.py runs both).
"""
from __future__ import annotations

import sys
from collections import Counter
from types import FrameType
from typing import Any

import torch
from torch._ops import OpOverload
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
SYNC_OPS = {aten.nonzero, aten._local_scalar_dense, aten.masked_select, aten.unique_consecutive, aten._unique2,
            aten.unique_dim, aten.nonzero_static}
INDEX_OPS = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}
COPY_OPS = {aten._to_copy, aten.copy_}


def in_triton_interpreter() -> bool:
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if "triton" in frame.f_code.co_filename and "interpreter" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _bool_index(args: tuple[Any, ...]) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


def _device_to_host(func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if func.overloadpacket is aten._to_copy:
        src, device = args[0], kwargs.get("device")
        return bool(src.is_cuda and device is not None and torch.device(device).type == "cpu")
    dst, src = args[0], args[1]
    return isinstance(src, torch.Tensor) and src.is_cuda and not dst.is_cuda


class SyncDetector(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's __init_subclass__ is unannotated
    """with SyncDetector() as syncs: engine.step()  ->  syncs.count, syncs.ops (op name -> count)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # TorchDispatchMode.__init__ is unannotated
        self.ops: Counter[str] = Counter()
        self._cpu = torch.Tensor.cpu

    @property
    def count(self) -> int:
        return sum(self.ops.values())

    def __torch_dispatch__(self, func: OpOverload, types: tuple[type, ...], args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet in SYNC_OPS or packet in INDEX_OPS or packet in COPY_OPS or packet is aten.repeat_interleave:
            if self._syncs(func, args, kwargs) and not in_triton_interpreter():
                self.ops[str(packet)] += 1
        return func(*args, **kwargs)

    def _syncs(self, func: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        packet = func.overloadpacket
        if packet in SYNC_OPS:
            return True
        if packet in INDEX_OPS:
            return _bool_index(args)
        if packet is aten.repeat_interleave:  # tensor repeats: the output size is their sum, read back
            return bool(func._overloadname != "self_int" and kwargs.get("output_size") is None)
        return _device_to_host(func, args, kwargs)

    def __enter__(self) -> SyncDetector:
        detector, cpu = self, self._cpu

        def counted_cpu(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if not tensor.is_cuda and not in_triton_interpreter():
                detector.ops["Tensor.cpu"] += 1
            return cpu(tensor, *args, **kwargs)

        setattr(torch.Tensor, "cpu", counted_cpu)  # noqa: B010 -- assigning to a method: mypy refuses the plain form
        super().__enter__()  # type: ignore[no-untyped-call]  # TorchDispatchMode.__enter__ is unannotated
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(torch.Tensor, "cpu", self._cpu)  # noqa: B010 -- see __enter__
        super().__exit__(*exc)  # type: ignore[no-untyped-call]  # TorchDispatchMode.__exit__ is unannotated
