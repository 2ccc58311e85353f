"""The CUDA API calls of one steady decode step on the triton backend (devtools/cuda_calls.py), counted under
Triton's interpreter: one graph replay, one copy each way with an event record and a wait each, one launch outside
the graph (the copy of the hidden states out), no allocation.
"""
from __future__ import annotations

import os

import pytest
import torch

from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.devtools.cuda_calls import KINDS, CudaCalls
from chattts_velocity.devtools.launch_counter import LaunchCounter
from chattts_velocity.engine.llm_engine import LLMEngine
from chattts_velocity.model import ChatTTSLlama, Embed, kernels
from chattts_velocity.model.kernels.triton import available
from chattts_velocity.schema import Prompt, SamplingParams

STEADY = {"graph_replays": 1, "memcpy_h2d": 1, "memcpy_d2h": 1, "event_records": 2, "event_syncs": 2,
          "launches_outside_graph": 1, "allocations": 0}
needs_interpreter = pytest.mark.skipif(available() is not None or os.environ.get("TRITON_INTERPRET") != "1",
                                       reason="needs Triton's interpreter (TRITON_INTERPRET=1)")


@pytest.fixture(autouse=True)
def gpu_heads_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "active_ops", None)  # the heads as a GPU runs them (tests/engine/test_launches.py)


def test_host_copies_syncs_and_allocations_are_seen_outside_an_engine() -> None:
    with CudaCalls() as calls:
        made = torch.zeros(3) + 1  # two allocations: zeros, then the sum's result
        made.cpu()  # a device-to-host copy on CUDA
        made.add_(1)  # in place: no allocation
    assert calls.counts["allocations"] == 2 and calls.counts["memcpy_d2h"] == 1
    assert calls.counts["launches_outside_graph"] == 3  # zeros' fill, the add, the add_
    assert set(calls.counts) == set(KINDS) and calls.total == sum(calls.counts.values())


@pytest.mark.triton
@needs_interpreter
@pytest.mark.parametrize("batch", [1, 3])
def test_a_steady_step_makes_eight_cuda_calls(batch: int) -> None:
    cfg = ModelConfig(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2,
                      num_hidden_layers=2, max_position_embeddings=128)
    engine = LLMEngine(ChatTTSLlama(cfg), Embed(cfg.hidden_size, cfg.num_audio_tokens, cfg.num_text_tokens, 4), cfg,
                       EngineConfig(backend="triton", max_num_seqs=batch, max_model_len=32, kv_cache_memory=1 << 24,
                                    overlap=True))
    for i in range(batch):
        engine.add_request(None, Prompt(torch.full((3, 4), i), torch.ones(3, dtype=torch.bool)),
                           SamplingParams(max_new_token=9, min_new_token=9, seed=i))
    with LaunchCounter(skip_kernels=True):  # prefill, the step that builds the persistent batch, a steady step
        for _ in range(3):
            engine.step()
    for _ in range(2):
        steady = engine.stats.num_steady_steps
        with CudaCalls(skip_kernels=True) as calls:
            engine.step()
        assert engine.stats.num_steady_steps == steady + 1
        assert dict(calls.counts) == STEADY
