"""Random and hostile InferCodeParams / RefineTextParams against both GPT paths on tiny weights (bounded).

Invariant: a params object is refused at construction with a ValueError naming one of its fields, or by each path
before any generation (what only the model can judge: lengths, one temperature per codebook) in the same way, or
the path synthesises with it (finite audio, nothing left running in the engine)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chattts_velocity import Chat, InferCodeParams, RefineTextParams

HOSTILE = [float("nan"), float("inf"), -float("inf"), 1e-45, -1.0, 0.0, 2**63, 2**70, -(2**63), True, "5", None]
FIELDS = {"temperature", "top_P", "top_K", "repetition_penalty", "max_new_token", "min_new_token", "manual_seed",
          "penalty_window"}


def values(normal: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(normal, normal, st.sampled_from(HOSTILE))


def infer_kwargs() -> st.SearchStrategy[dict]:
    # max_new_token always drawn: left out, random weights (no EOS) would run the default 2048 / 384 steps per example
    return st.fixed_dictionaries({"max_new_token": values(st.integers(1, 6))}, optional={
        "temperature": values(st.one_of(st.floats(1e-6, 2.0), st.lists(st.floats(0.05, 1.5), min_size=1,
                                                                          max_size=4))),
        "top_P": values(st.floats(0.01, 1.0)),
        "top_K": values(st.integers(1, 2000)),
        "repetition_penalty": values(st.floats(0.5, 2.0)),
        "min_new_token": values(st.integers(0, 6)),
        "manual_seed": values(st.integers(0, 2**63 - 1)),
    })


@pytest.fixture(scope="module")
def chat(tiny_assets) -> Chat:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False)
    return chat


def build(cls, kwargs: dict):
    """The params, or None after checking that the refusal is a ValueError naming one of the fields."""
    try:
        return cls(show_tqdm=False, **kwargs)
    except ValueError as exc:
        assert str(exc).split(":", 1)[0] in FIELDS, str(exc)
        return None


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(kwargs=infer_kwargs())
def test_infer_code_params_are_refused_clearly_or_work_on_both_paths(chat: Chat, kwargs: dict) -> None:
    params = build(InferCodeParams, kwargs)
    if params is None:
        return
    for use_vllm in (False, True):
        try:  # what only the model can judge (too long for it, 2 temperatures for 4 codebooks) is refused here
            wav = chat.infer(["Fuzz me."], skip_refine_text=True, params_infer_code=params, use_vllm=use_vllm)[0]
        except ValueError as exc:
            assert str(exc).split(":", 1)[0] in FIELDS, str(exc)
            continue
        assert wav.dtype == np.float32 and np.isfinite(wav).all()
    assert not chat.engine().has_unfinished_requests() and chat.engine().block_manager.num_used_blocks == 0


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(kwargs=infer_kwargs())
def test_refine_params_are_refused_clearly_or_work_on_both_paths(chat: Chat, kwargs: dict) -> None:
    kwargs = {k: v for k, v in kwargs.items() if k != "temperature" or not isinstance(v, list) or len(v) == 1}
    params = build(RefineTextParams, kwargs)
    if params is None:
        return
    for use_vllm in (False, True):
        try:
            text = chat.infer(["Fuzz me."], refine_text_only=True, params_refine_text=params, use_vllm=use_vllm)[0]
        except ValueError as exc:
            assert str(exc).split(":", 1)[0] in FIELDS, str(exc)
            continue
        assert isinstance(text, str)
    assert math.isfinite(params.repetition_penalty)
