"""One graph a steady decode step (engine/worker/backends/step_graph.py): what the captured function may touch.

Inside the captured region there must be no host tensor (a tensor built on the host and baked into the graph), no
host-to-device copy and no read of a device value on the host (`.item()`, nonzero, ...). On CPU (Triton's
interpreter) the function runs under SyncDetector and a dispatch mode that checks every tensor an op reads: each
must be one of the graph's static buffers, a weight, the KV pool, or made by an earlier op of the same region.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.devtools.sync_detector import SyncDetector, in_triton_interpreter
from chattts_velocity.engine.llm_engine import LLMEngine
from chattts_velocity.engine.worker.backends.step_graph import StepInputs
from chattts_velocity.model import ChatTTSLlama, Embed
from chattts_velocity.model.kernels.triton import available
from chattts_velocity.schema import Prompt, SamplingParams

pytestmark = [pytest.mark.triton, pytest.mark.skipif(
    available() is not None or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs Triton's interpreter (TRITON_INTERPRET=1)")]


class ForeignTensors(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records every op input whose storage is neither allowed up front nor written by an op seen before."""

    def __init__(self, allowed: list[torch.Tensor]) -> None:
        super().__init__()
        self.known = {t.untyped_storage().data_ptr() for t in allowed}
        self.foreign: list[str] = []
        self.host_copies: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if in_triton_interpreter():
            return out
        # a tensor made from host data; a 0-dim one is a scalar (`x[i] = False`), a kernel argument, not a copy
        if func.overloadpacket in (torch.ops.aten.lift_fresh, torch.ops.aten.lift_fresh_copy) and out.dim() > 0:
            self.host_copies.append(f"{func}: {tuple(out.shape)}")
            return out
        if func.overloadpacket in (torch.ops.aten.lift_fresh, torch.ops.aten.lift_fresh_copy):
            self.known.add(out.untyped_storage().data_ptr())
            return out
        for tensor in tree_flatten((args, kwargs))[0]:
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in self.known:
                self.foreign.append(f"{func}: {tuple(tensor.shape)} {tensor.dtype}")
        self.known |= {t.untyped_storage().data_ptr() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)}
        return out


def _engine() -> LLMEngine:
    cfg = ModelConfig(hidden_size=128, intermediate_size=256, num_attention_heads=2, num_key_value_heads=2,
                      num_hidden_layers=2, max_position_embeddings=128)
    engine = LLMEngine(ChatTTSLlama(cfg), Embed(cfg.hidden_size, cfg.num_audio_tokens, cfg.num_text_tokens, 4), cfg,
                       EngineConfig.from_kwargs(backend="triton", dtype="float32", max_num_seqs=4, max_model_len=32,
                                    kv_cache_memory=1 << 22))
    for i in range(3):
        engine.add_request(None, Prompt(torch.full((3, 4), i), torch.ones(3, dtype=torch.bool)),
                           SamplingParams(max_new_token=6, min_new_token=6, seed=i, top_p=0.7, top_k=20))
    for _ in range(3):
        engine.step()
    assert engine.stats.num_steady_steps >= 1
    return engine


def test_the_captured_step_reads_only_its_buffers_weights_and_the_kv_pool() -> None:
    engine = _engine()
    runner = engine.runner
    graphs = runner.step_graphs
    assert graphs is not None and set(graphs.inputs) == {4}  # 3 sequences replay the graph of 4
    inputs: StepInputs = graphs.inputs[4]
    allowed = [getattr(inputs, name) for name in inputs.__dataclass_fields__]
    allowed += [*runner.model.parameters(), *runner.model.buffers(), *runner.embed.parameters(),
                *runner.embed.buffers(), *(t for pair in runner.kv_cache for t in pair)]
    with torch.inference_mode():
        runner.embed.logits_rowwise(torch.zeros(1, 128), "code")  # the heads' weights are cached at first use
        runner.embed.embed_codes(torch.zeros(1, 4, dtype=torch.int64))
    with SyncDetector() as syncs, ForeignTensors(allowed + list(_cached_weights(runner.embed))) as seen:
        with torch.inference_mode():
            tokens, hidden = graphs.fn(inputs)
    assert tokens.shape == (4, 4) and hidden.shape == (4, 128)
    assert syncs.count == 0, syncs.ops
    assert seen.host_copies == []
    assert seen.foreign == []


def _cached_weights(embed: Embed) -> list[torch.Tensor]:
    """Tensors the embedding caches from its weights (derived once, device-resident)."""
    found = []
    for value in vars(embed).values():
        if isinstance(value, dict):
            found += [t for entry in value.values() for t in tree_flatten(entry)[0] if isinstance(t, torch.Tensor)]
    return found


class EmulatedCapture:
    """torch.cuda's graph API with a capture's meaning, on a CPU: what runs under `torch.cuda.graph` leaves no trace
    (buffers and KV pool restored afterwards, as a real capture executes nothing) and `replay()` runs the recorded
    call again into the captured outputs. Anything a step graph does outside the capture (its eager run that
    compiles the kernels) keeps its effects, as on a GPU."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, graphs: Any, pool: list[torch.Tensor]) -> None:
        self.graphs, self.pool, self.capturing = graphs, pool, None
        fn = graphs.fn

        def recorded(inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
            out = fn(inputs)
            if self.capturing is not None:
                self.capturing.call = (inputs, out)
            return out

        graphs.fn, graphs.capture = recorded, True
        emulation = self

        class Graph:
            call: tuple[StepInputs, tuple[torch.Tensor, torch.Tensor]]

            def replay(self) -> None:
                inputs, outputs = self.call
                for target, value in zip(outputs, fn(inputs), strict=True):
                    target.copy_(value)

        class Capture:
            def __init__(self, graph: Graph, pool: Any = None) -> None:
                self.graph = graph

            def __enter__(self) -> None:
                buffers = [getattr(t, name) for t in emulation.graphs.inputs.values()
                           for name in t.__dataclass_fields__]
                self.saved = [(t, t.clone()) for t in buffers + emulation.pool]
                emulation.capturing = self.graph

            def __exit__(self, *exc: object) -> None:
                emulation.capturing = None
                for tensor, value in self.saved:
                    tensor.copy_(value)

        class Stream:
            def wait_stream(self, other: object) -> None:
                pass

        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "current_stream", Stream)
        monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", Capture)


def _codes(capture: pytest.MonkeyPatch | None) -> dict[str, list[torch.Tensor]]:
    cfg = ModelConfig(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=2,
                      num_hidden_layers=2, max_position_embeddings=128)
    torch.manual_seed(0)
    engine = LLMEngine(ChatTTSLlama(cfg), Embed(cfg.hidden_size, cfg.num_audio_tokens, cfg.num_text_tokens, 4), cfg,
                       EngineConfig.from_kwargs(backend="triton", dtype="float32", max_num_seqs=4, max_model_len=32,
                                    kv_cache_memory=1 << 22))
    if capture is not None:
        runner = engine.runner
        EmulatedCapture(capture, runner.step_graphs, [t for pair in runner.kv_cache for t in pair])
    for i in range(3):
        engine.add_request(f"r{i}", Prompt(torch.full((3 + i, 4), i), torch.ones(3 + i, dtype=torch.bool)),
                           SamplingParams(max_new_token=5, min_new_token=5, seed=i, repetition_penalty=1.3))
    codes: dict[str, list[torch.Tensor]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            # a clone: on a CPU a replay's tokens stay in the graph's output buffer (a GPU's copy to the host
            # makes new ones)
            codes.setdefault(out.request_id, []).append(out.token_ids.clone())
    assert engine.stats.num_steady_steps >= 3
    return codes


def test_a_captured_step_graph_samples_what_the_eager_step_does(monkeypatch: pytest.MonkeyPatch) -> None:
    # the first replay of each size follows an eager run (Triton compiles) and a capture; neither may move the
    # batch on (the step writes its sampled tokens into its own ids)
    eager, captured = _codes(None), _codes(monkeypatch)
    assert eager.keys() == captured.keys() == {"r0", "r1", "r2"}
    for rid, chunks in eager.items():
        assert torch.equal(torch.cat(chunks), torch.cat(captured[rid])), rid
