"""Kernel launches of one steady decode step on the triton backend (devtools/launch_counter.py), counted under
Triton's interpreter: what the step launches on a GPU, the captured graph's kernels and the eager ones.

The count is split into a part per layer and a part outside the layers (embedding, heads, sampler, metadata) by
counting at two depths; both are pinned, and ChatTTS's depth (20 layers) must come to at most 110 launches.
float32 weights; bf16 weights launch the same.
"""
from __future__ import annotations

import os

import pytest
import torch

from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.devtools.launch_counter import LaunchCounter
from chattts_velocity.engine.llm_engine import LLMEngine
from chattts_velocity.model import ChatTTSLlama, Embed, kernels
from chattts_velocity.model.kernels.triton import available
from chattts_velocity.schema import GenerationOutput, Prompt, SamplingParams

pytestmark = [pytest.mark.triton, pytest.mark.skipif(
    available() is not None or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs Triton's interpreter (TRITON_INTERPRET=1)")]
CHATTTS_LAYERS, TARGET = 20, 110
# the embedding gather with the slots, the final norm, the heads' GEMM, the sampler (temperature + penalty, then
# top-p + top-k with the draw), the per-step host-to-device copy and the copy of the hidden states: a ceiling
OUTSIDE_LAYERS_MAX = 7
PER_LAYER_MAX = 5  # norm->q|k|v+RoPE+KV store, attention, o+residual, norm->gate|up+SiLU*up, down+residual


@pytest.fixture(autouse=True)
def gpu_heads_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The heads as a GPU runs them (one GEMM launch): not the C++ CPU heads, which an earlier test may have loaded."""
    monkeypatch.setattr(kernels, "active_ops", None)


def _assert_no_error(outputs: list[GenerationOutput]) -> None:
    errors = [out.error for out in outputs if out.error is not None]
    assert not errors, errors


def _steady_step_launches(layers: int, batch: int, dtype: str = "float32") -> LaunchCounter:
    cfg = ModelConfig(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2,
                      num_hidden_layers=layers, max_position_embeddings=128)
    engine = LLMEngine(ChatTTSLlama(cfg), Embed(cfg.hidden_size, cfg.num_audio_tokens, cfg.num_text_tokens, 4), cfg,
                       EngineConfig.from_kwargs(backend="triton", dtype=dtype, max_num_seqs=batch, max_model_len=32,
                                    kv_cache_memory=1 << 24))
    for i in range(batch):
        engine.add_request(None, Prompt(torch.full((3, 4), i), torch.ones(3, dtype=torch.bool)),
                           SamplingParams(max_new_token=6, min_new_token=6, seed=i))
    with LaunchCounter(skip_kernels=True):  # prefill, then the step that builds the persistent batch
        _assert_no_error(engine.step())
        _assert_no_error(engine.step())
    steady = engine.stats.num_steady_steps
    with LaunchCounter(skip_kernels=True) as launches:
        _assert_no_error(engine.step())
    assert engine.stats.num_steady_steps == steady + 1, [seq.status for seq in engine.scheduler.running]
    return launches


@pytest.fixture(scope="module")
def split() -> tuple[int, int]:
    """(launches per layer, launches outside the layers) of a steady step of 3 sequences."""
    two, four = (_steady_step_launches(layers, 3).count for layers in (2, 4))
    per_layer = (four - two) // 2
    assert four - two == 2 * per_layer
    return per_layer, two - 2 * per_layer


def test_the_count_sees_gemms_triton_kernels_and_the_sampler() -> None:
    launches = _steady_step_launches(2, 1)
    assert launches.ops["aten.mm"] == 1  # the code head; the layers' GEMMs are inside their Triton kernels
    for kernel in ("_norm_qkv_rope_kernel", "_decode_kernel", "_norm_gate_up_kernel"):
        assert launches.ops[f"triton.{kernel}"] == 2  # once a layer
    assert launches.ops["triton._residual_linear_kernel"] == 2 * 2  # o-proj and down-proj a layer
    for kernel in ("_decode_inputs_kernel", "_rms_norm_kernel", "_temperature_penalty_kernel", "_sample_kernel"):
        assert launches.ops[f"triton.{kernel}"] == 1
    # top-p + top-k runs inside the draw's kernel: no sort, no softmax, no kernel of its own
    assert "aten.sort" not in launches.ops and "aten._softmax" not in launches.ops
    assert "triton._top_p_top_k_kernel" not in launches.ops
    assert launches.ops["aten.copy_"] == 2  # the per-step block in, the hidden states out (into a HiddenLog row)
    assert "aten.clone" not in launches.ops
    assert launches.count == 2 * 5 + 7


def test_launches_barely_depend_on_the_batch_size() -> None:
    one, five = _steady_step_launches(2, 1), _steady_step_launches(2, 5)
    assert {k: n for k, n in one.ops.items() if k.startswith("triton.")} == \
        {k: n for k, n in five.ops.items() if k.startswith("triton.")}
    assert one.count == five.count


def test_launches_outside_the_layers_stay_pinned(split: tuple[int, int]) -> None:
    per_layer, outside = split
    assert per_layer <= PER_LAYER_MAX
    assert outside <= OUTSIDE_LAYERS_MAX


def test_chattts_depth_launches_at_most_110_a_step(split: tuple[int, int]) -> None:
    per_layer, outside = split
    assert CHATTTS_LAYERS * per_layer + outside <= TARGET


def test_bf16_weights_launch_what_float32_weights_launch() -> None:
    """The casts a bf16 step would add (embeddings to bf16, the last hidden states to fp32) are inside its kernels."""
    assert _steady_step_launches(2, 3, "bfloat16").ops == _steady_step_launches(2, 3).ops


def test_a_skipped_kernel_leaves_zeros_in_its_outputs_and_its_inputs_as_they_were() -> None:
    """Under skip_kernels the sampled tokens are zeros, never what the allocator's memory held last (a stale EOS
    there would end the sequences before the step that is counted); host-made inputs are not touched."""
    from chattts_velocity.model.kernels.triton import sampling

    stale = [torch.full((64, 4), 625, dtype=torch.int64) for _ in range(256)]
    del stale
    seeds = torch.arange(1, 65)
    with LaunchCounter(skip_kernels=True) as launches:
        tokens = sampling.sample(torch.randn(64 * 4, 626), seeds, 4)
    assert launches.ops["triton._sample_kernel"] == 1
    assert tokens.shape == (64, 4) and not tokens.any()
    assert torch.equal(seeds, torch.arange(1, 65))
