"""The triton backend compiles every kernel variant at load: no request waits for a JIT compile.

On a GPU the compilations themselves are recorded (Triton's JITFunction._do_compile, called on a miss in its
in-memory cache). Under Triton's interpreter nothing compiles, so each launch is keyed as Triton's compile cache keys
it (the kernel, its constexprs, the pointer dtypes, integer arguments equal to 1 or divisible by 16 unless excluded,
pointers aligned to 16 bytes): a launch with a key not seen at load would be a compilation on a GPU.
"""
from __future__ import annotations

import pytest
import torch

from chattts_velocity import Chat, InferCodeParams, load_pretrained
from chattts_velocity.model.kernels.triton import available
from chattts_velocity.text import split_pieces

REASON = available()
pytestmark = [pytest.mark.triton, pytest.mark.skipif(REASON is not None, reason=f"Triton unavailable: {REASON}")]


def _key(kernel, args: tuple, kwargs: dict) -> tuple:
    skip = set(kernel.kwargs.get("do_not_specialize") or ())
    parts = [kernel.fn.__name__]
    for name, value in zip(kernel.arg_names, args, strict=False):  # the arguments after args come by keyword
        if isinstance(value, torch.Tensor):
            parts.append((name, str(value.dtype), value.data_ptr() % 16 == 0))
        elif isinstance(value, int) and not isinstance(value, bool) and name not in skip:
            parts.append((name, value == 1, value % 16 == 0))
    return (*parts, tuple(sorted((k, repr(v)) for k, v in kwargs.items())))


@pytest.fixture
def launches(monkeypatch, triton_device):
    seen: list[tuple] = []
    if triton_device == "cuda":
        from triton.runtime.jit import JITFunction

        compile_ = JITFunction._do_compile

        def recorded(self, key, *args, **kwargs):
            seen.append((self.fn.__name__, str(key)))
            return compile_(self, key, *args, **kwargs)

        monkeypatch.setattr(JITFunction, "_do_compile", recorded)
        return seen
    from triton.runtime.interpreter import InterpretedFunction

    run = InterpretedFunction.run

    def keyed(self, *args, grid, warmup, **kwargs):
        seen.append(_key(self, args, kwargs))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", keyed)
    return seen


def test_no_kernel_variant_is_new_in_the_first_32_steps_after_load(tiny_assets, launches, triton_device) -> None:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False)
    llm = load_pretrained(tiny_assets, is_vllm=True, device=triton_device, backend="triton", max_num_seqs=4)
    at_load = set(launches)
    if triton_device == "cpu":  # (a GPU compiles nothing an earlier test of this process compiled)
        assert len(at_load) >= 8  # store, prefill, decode, 2 norms, rope, penalty and noise in two vocabularies
    params = InferCodeParams(max_new_token=30, min_new_token=30, show_tqdm=False, manual_seed=3)
    requests = chat.speech_requests(split_pieces(["Hello world.", "A longer sentence to read."], split=False),
                                    params)
    engine = llm.engine
    for i, (prompt, sampling) in enumerate(zip(requests.prompts, requests.sampling, strict=True)):
        engine.add_request(f"r{i}", prompt, sampling)
    launches.clear()
    for _ in range(32):  # the prefill, then decode steps whose penalty history grows from 0 to its window
        engine.step()
    if triton_device == "cuda":
        assert not launches, launches  # compilations after load
    else:
        assert launches, "the steps launched no kernel"
        assert set(launches) <= at_load, set(launches) - at_load
