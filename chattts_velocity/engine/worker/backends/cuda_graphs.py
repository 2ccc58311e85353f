"""Engine stage, CUDA backend: CUDA graphs of the triton backend's decode step, one per batch size of a ladder.

In: a decode step (embeds [B, H], StepTensors). Out: hidden [B, H]. A step of B sequences replays the graph of the
smallest captured size >= B on static buffers: the B real rows first, then padding rows at position 0 of the pad
block (step_inputs.padded_decode), which write their K/V there and attend only to it. Block tables
are padded to the widest a sequence can need (max_model_len / block_size), so one graph serves every context.
Batches above the largest size run eagerly. Only TritonBackend on a CUDA device captures; on CPU nothing here runs
but the pure functions (graph_batch_sizes, bucket) and the buffer filling, which the tests check.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable

import torch

from chattts_velocity.engine.worker.step_inputs import PagedKV, StepTensors, padded_decode
from chattts_velocity.model import DecodeMetadata

DecodeStep = Callable[[torch.Tensor, torch.Tensor, DecodeMetadata], torch.Tensor]  # embeds, positions, meta


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, ... below max_num_seqs, then max_num_seqs itself: every engine batch has a graph."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs: must be >= 1, got {max_num_seqs}")
    sizes = [1 << i for i in range(max_num_seqs.bit_length()) if 1 << i < max_num_seqs]
    return sizes + [max_num_seqs]


def bucket(batch: int, sizes: list[int]) -> int | None:
    """The smallest size >= batch (sizes ascending), or None when batch is above them all."""
    i = bisect.bisect_left(sizes, batch)
    return sizes[i] if i < len(sizes) else None


class StaticInputs:
    """The buffers a graph of `size` rows reads; filled in place before each replay."""

    def __init__(self, kv: PagedKV, size: int, width: int, hidden: int, dtype: torch.dtype) -> None:
        self.kv, self.size, self.width = kv, size, width
        self.embeds = torch.zeros(size, hidden, dtype=dtype, device=kv.device)  # [size, H]
        self.positions = torch.zeros(size, dtype=torch.int64, device=kv.device)  # [size]
        self.meta = DecodeMetadata(
            slot_mapping=torch.zeros(size, dtype=torch.int64, device=kv.device),  # [size]
            block_tables=torch.zeros(size, width, dtype=torch.int64, device=kv.device),  # [size, width]
            context_lens=torch.ones(size, dtype=torch.int64, device=kv.device),  # [size]
        )
        empty = torch.zeros(0, dtype=torch.int64, device=kv.device)
        self.fill(empty.new_zeros(0, hidden, dtype=dtype),
                  StepTensors([], [], empty, empty, empty.view(0, 1), None))  # all padding rows

    def fill(self, embeds: torch.Tensor, step: StepTensors) -> None:
        """Copy one step's rows in (device-to-device copies only), padding rows after them."""
        positions, meta = padded_decode(step, self.kv, self.size, self.width)
        self.positions.copy_(positions)
        for static, value in zip(self.meta, meta, strict=True):
            static.copy_(value)
        self.embeds[: embeds.shape[0]].copy_(embeds)
        self.embeds[embeds.shape[0]:].zero_()


class DecodeGraphs:
    """One captured decode step per size of `sizes`, sharing a memory pool; run() replays the smallest that fits."""

    def __init__(self, step: DecodeStep, kv: PagedKV, sizes: list[int], width: int, hidden: int,
                 dtype: torch.dtype) -> None:
        self.step, self.sizes = step, sorted(sizes)
        self.inputs = {size: StaticInputs(kv, size, width, hidden, dtype) for size in self.sizes}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}  # [size, H], written by each replay

    def covers(self, batch: int) -> bool:
        return bucket(batch, self.sizes) is not None

    def run(self, embeds: torch.Tensor, step: StepTensors) -> torch.Tensor:
        """hidden [B, H] of a step of B <= max(sizes) sequences (a copy: the next replay overwrites the output)."""
        size = bucket(step.num_seqs, self.sizes)
        if size is None:
            raise ValueError(f"DecodeGraphs.run: {step.num_seqs} sequences, more than the largest graph; see covers()")
        inputs = self.inputs[size]
        inputs.fill(embeds, step)
        if size in self.graphs:
            self.graphs[size].replay()
            out = self.outputs[size]
        else:  # not captured (CPU tests): the same padded step, eagerly
            out = self.step(inputs.embeds, inputs.positions, inputs.meta)
        return out[: step.num_seqs].clone()

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm up (Triton compiles on first launch) and capture every size, largest first, on padding rows only."""
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            inputs = self.inputs[size]
            side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch leaves Stream() unannotated
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.step(inputs.embeds, inputs.positions, inputs.meta)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self.step(inputs.embeds, inputs.positions, inputs.meta)
            self.graphs[size] = graph
