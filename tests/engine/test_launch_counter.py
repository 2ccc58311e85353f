"""devtools/launch_counter.py: kernels a piece of code would launch on a GPU, counted on a CPU."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity.devtools.launch_counter import LaunchCounter
from chattts_velocity.model.kernels.triton import available

REASON = available()


def test_counts_computing_ops_not_views_or_allocations() -> None:
    x = torch.randn(4, 4)
    with LaunchCounter() as launches:
        y = x.view(2, 8).t()  # views: no kernel
        z = torch.empty(8, 2)  # allocation: no kernel
        z.copy_(y)  # a device-to-device copy: one kernel
        w = torch.relu(z) @ y.t()  # relu + mm
        w.sum()  # a reduction
    assert launches.torch == {"copy_": 1, "relu": 1, "mm": 1, "sum": 1}
    assert launches.total == 4 and launches.copies == 0 and not launches.triton


def test_nothing_is_counted_outside_and_triton_is_restored() -> None:
    with LaunchCounter() as launches:
        pass
    torch.ones(3) + 1
    assert launches.total == 0
    if REASON is None:
        from triton.runtime.interpreter import InterpretedFunction

        assert "LaunchCounter" not in repr(InterpretedFunction.run.__qualname__)


@pytest.mark.triton
@pytest.mark.skipif(REASON is not None, reason=f"Triton kernels unavailable: {REASON}")
def test_counts_each_triton_launch_once() -> None:
    from chattts_velocity.model.kernels.triton import norm_rope

    x, weight = torch.randn(3, 64), torch.ones(64)
    with LaunchCounter() as launches:
        norm_rope.rms_norm(x, weight, 1e-6)
        norm_rope.rms_norm(x, weight, 1e-6)
    assert launches.triton == {"_rms_norm_kernel": 2}
    assert launches.total == 2  # the interpreter's own numpy round trips and the output allocation are not launches
