"""Engine stage, triton backend: one graph a steady decode step — slots, embedding gather, layers, heads and the
device sampler — captured per batch size of the ladder (cuda_graphs.graph_batch_sizes) on static buffers.

In: a persistent batch's step (engine/sched/decode_batch.py): the embedding ids (the tokens the last step sampled,
on the device), positions and block tables on the device, the sampler's per-row inputs. Out: tokens [B, rows] and the
last hidden states [B, H] on the device. Before a replay the host writes only device-to-device copies and one
host-to-device copy of what changes every step (the EOS mask, the penalty history, the noise seeds), through
double-buffered pinned staging guarded by events; the fixed per-row parameters are written when the batch changes.
Padding rows sit at position 0 of the pad block (they write their K/V only there) and sample with neutral parameters.
On CPU nothing is captured: run() calls the same function eagerly on the same buffers (what the tests check).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from chattts_velocity.engine.sched.decode_batch import DecodeBatch, StepTable
from chattts_velocity.engine.worker.backends.cuda_graphs import bucket
from chattts_velocity.engine.worker.hidden_log import HiddenLog
from chattts_velocity.engine.worker.sampling import logits_processors as lp
from chattts_velocity.engine.worker.sampling.device_sampler import DeviceSampler
from chattts_velocity.engine.worker.sampling.sampler import Sampler
from chattts_velocity.engine.worker.step_inputs import to_device
from chattts_velocity.model import DecodeMetadata, Embed
from chattts_velocity.model.embed import BLAS_MIN_ROWS


@dataclass
class StepInputs:
    """The static buffers of one graph: `size` rows (R = size * rows sampling rows), history `window` wide.

    What changes every step lives in one int64 block (`per_step`, written by one copy): positions, seeds, the EOS mask,
    the ring columns and the penalty history are views of it, in that order (all but the history tabulated 32 steps
    at a time: StepGraphs._tabulated). The history's last column is scratch (always -1 after the step's ring write):
    the ring column of a row whose input goes to no ring.
    """

    ids: torch.Tensor  # [size, num_vq] int64; each replay writes its sampled tokens here (the next step's ids)
    tables: torch.Tensor  # [size, width] int64
    temperatures: torch.Tensor  # [R] float32
    eos_ids: torch.Tensor  # [R] int64
    penalties: torch.Tensor  # [R] float32
    top_p: torch.Tensor  # [R] float32
    top_k: torch.Tensor  # [R] int64
    per_step: torch.Tensor  # [2 * size + 2 * R + R * window] int64
    positions: torch.Tensor  # [size] int64 (view of per_step)
    seeds: torch.Tensor  # [size] int64, the step seeds' bits (view)
    mask_eos: torch.Tensor  # [R] int64, 1 = EOS forbidden (view)
    ring_cols: torch.Tensor  # [R] int64: the history column the row's input id (ids) goes to (view)
    history: torch.Tensor  # [R, window] int64, -1 = empty (view)
    hidden: torch.Tensor  # [max(BLAS_MIN_ROWS, size), H] float32: the last hidden states; rows past size stay 0 (the
    # heads' BLAS GEMM gets the rows of its row-invariant path without a copy)

    @classmethod
    def allocate(cls, size: int, width: int, rows: int, window: int, num_vq: int, hidden_size: int, pad_block: int,
                 device: torch.device) -> StepInputs:
        num = size * rows

        def zeros(dtype: torch.dtype, *shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        head = 2 * size + 2 * num  # positions, seeds, EOS mask, ring columns; then the history
        per_step = zeros(torch.int64, head + num * window)
        inputs = cls(zeros(torch.int64, size, num_vq), zeros(torch.int64, size, width) + pad_block,
                     zeros(torch.float32, num) + 1, zeros(torch.int64, num), zeros(torch.float32, num) + 1,
                     zeros(torch.float32, num) + 1, zeros(torch.int64, num), per_step, per_step[:size],
                     per_step[size: 2 * size], per_step[2 * size: 2 * size + num], per_step[2 * size + num: head],
                     per_step[head:].view(num, window), zeros(torch.float32, max(BLAS_MIN_ROWS, size), hidden_size))
        inputs.history.fill_(-1)
        inputs.ring_cols.fill_(window - 1)
        return inputs

    def row_params(self, rows: int) -> lp.RowParams:
        """The sampler's chain parameters, every step on (neutral values where a row does not use it); mask_eos
        int64, nonzero = forbidden (the draw's kernel reads it as it is)."""
        return lp.RowParams(rows, self.temperatures, self.eos_ids, self.mask_eos, self.penalties,
                            self.history[:, :-1], self.top_p, self.top_k)  # the scratch column left out


StepFn = Callable[[StepInputs], tuple[torch.Tensor, torch.Tensor]]  # -> tokens [size, rows], hidden [size, H]


class Staging:
    """Host-to-device copies through two pinned buffers used in turn; each buffer's event says when its last copy
    has left, so the host never overwrites bytes still in flight. On CPU: plain tensors."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buffers: list[torch.Tensor | None] = [None, None]  # pinned host buffers
        self.events: list[Any] = [None, None]
        self.turn = 0

    def send(self, values: np.ndarray, into: torch.Tensor) -> None:
        """Copy values [n] int64 from the host into `into` [n] on the device (ordered on the current stream)."""
        if self.device.type != "cuda":
            into.copy_(torch.from_numpy(values))
            return
        turn, n = self.turn, values.shape[0]
        self.turn ^= 1
        if self.events[turn] is not None:
            self.events[turn].synchronize()  # this buffer's previous copy has left
        buffer = self.buffers[turn]
        if buffer is None or buffer.shape[0] < n:
            buffer = torch.empty(n, dtype=torch.int64, pin_memory=True)
            self.buffers[turn] = buffer
        buffer.numpy()[:n] = values
        into.copy_(buffer[:n], non_blocking=True)
        self.events[turn] = torch.cuda.Event()  # type: ignore[no-untyped-call]  # unannotated in torch
        self.events[turn].record()


class StepGraphs:
    """run(state, sampler, ids, tables) replays the graph of the smallest size >= len(state) (captured on first
    use, on CUDA), after filling its buffers; on CPU it calls `fn` on them."""

    def __init__(self, fn: StepFn, sizes: list[int], width: int, num_vq: int, hidden_size: int, pad_block: int,
                 device: torch.device) -> None:
        self.fn, self.sizes, self.width, self.num_vq, self.hidden_size = fn, sorted(sizes), width, num_vq, hidden_size
        self.pad_block, self.device, self.capture = pad_block, device, device.type == "cuda"
        self.staging = Staging(device)
        self.hidden_log = HiddenLog(hidden_size, device)  # where each step's hidden states are copied out
        self.inputs: dict[int, StepInputs] = {}
        self.graphs: dict[int, tuple[Any, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.filled: dict[int, DecodeBatch] = {}  # size -> the batch whose fixed parameters are in its buffers
        self.blocks: dict[int, tuple[DecodeBatch, np.ndarray]] = {}  # size -> a batch's host per-step block
        self.tabulated: dict[int, tuple[StepTable, int, np.ndarray]] = {}  # size -> (table, window, its block heads)
        self.pool: Any = None

    def covers(self, batch: int) -> bool:
        return bucket(batch, self.sizes) is not None

    def warm_up(self, rows: int) -> None:
        """Run the step once on padding rows only (the pad block, neutral parameters) at the smallest size and the
        smallest even one, so that every kernel variant a replay launches compiles at load (at odd sizes the seeds'
        view of the per-step block is not 16-byte aligned, a variant of its own)."""
        for size in {self.sizes[0], next((s for s in self.sizes if s % 2 == 0), self.sizes[0])}:
            self.fn(StepInputs.allocate(size, self.width, rows, 16, self.num_vq, self.hidden_size, self.pad_block,
                                        self.device))

    def padding_like(self, inputs: StepInputs) -> StepInputs:
        """New buffers of inputs' shapes on padding rows only. The eager run before a capture takes these: a step
        writes its sampled tokens into its ids and its inputs into the penalty ring, so running it on the batch's
        own buffers would move the batch a step on before the captured replay runs that step."""
        size, window = inputs.ids.shape[0], inputs.history.shape[1]
        return StepInputs.allocate(size, self.width, inputs.temperatures.shape[0] // size, window, self.num_vq,
                                   self.hidden_size, self.pad_block, self.device)

    def run(self, state: DecodeBatch, sampler: Sampler, ids: torch.Tensor, tables: torch.Tensor, ahead: int = 0,
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> tokens [B, rows] (a view, valid until the next replay) and hidden [B, H] (a copy: a HiddenLog row).
        ids [B, rows] (host or device) are read only when the buffers take a new batch. ahead 1: the step after one
        whose tokens the host has not read (its ids are that step's tokens, already in the buffer)."""
        num, size = len(state), bucket(len(state), self.sizes)
        if size is None:
            raise ValueError(f"StepGraphs.run: {num} sequences, more than the largest graph; see covers()")
        inputs = self._buffers(size, state)
        if self.filled.get(size) is not state:  # a new batch: its fixed parameters, tables and ids
            self._fill_fixed(inputs, state, sampler)
            inputs.ids[:num].copy_(to_device(ids, self.device))
            inputs.tables[:num, : tables.shape[1]].copy_(tables)
            self.filled[size] = state
        elif len(state.grown):  # the ids are the last replay's tokens already
            inputs.tables[:num, : tables.shape[1]].copy_(tables)
        self._fill_step(inputs, state, size, ahead)
        tokens, hidden = self._replay(size, inputs)
        kept = self.hidden_log.next_rows(num)
        kept.copy_(hidden[:num])
        return tokens[:num], kept

    def _buffers(self, size: int, state: DecodeBatch) -> StepInputs:
        window = max(16, state.history.shape[2] + 1)  # and a scratch column
        inputs = self.inputs.get(size)
        if inputs is None or inputs.history.shape[1] < window:  # a wider penalty window: new buffers, new graph
            inputs = StepInputs.allocate(size, self.width, state.rows, window, self.num_vq, self.hidden_size,
                                         self.pad_block, self.device)
            self.inputs[size] = inputs
            self.graphs.pop(size, None)
            self.filled.pop(size, None)
        return inputs

    def _fill_fixed(self, inputs: StepInputs, state: DecodeBatch, sampler: Sampler) -> None:
        """The parameters fixed while the batch stays; padding rows get neutral ones."""
        num = len(state) * state.rows
        static = sampler.static_rows(state)
        for name, value, pad in (("temperatures", static.temperatures, 1.0), ("eos_ids", static.eos_ids, 0),
                                 ("penalties", static.penalties, 1.0), ("top_p", static.top_p, 1.0),
                                 ("top_k", static.top_k, 0)):
            buffer: torch.Tensor = getattr(inputs, name)
            buffer[num:].fill_(pad)
            if value is None:
                buffer[:num].fill_(pad)
            else:
                buffer[:num].copy_(value.to(self.device))
        inputs.ids[len(state):].fill_(0)
        inputs.tables[len(state):].fill_(self.pad_block)

    def _fill_step(self, inputs: StepInputs, state: DecodeBatch, size: int, ahead: int) -> None:
        """One host-to-device copy of the per-step block: positions, seeds, EOS mask and ring columns (a row of the
        batch's tabulated steps), then the history; padding rows at position 0 with seed 0, no mask, the scratch
        column and an empty history. The host block is kept per batch. A step `ahead` of the host's tokens has its
        counters moved on by one and a history one token short: the step's ring write puts the missing token (its
        input ids) in."""
        num, rows, window = len(state), state.rows, inputs.history.shape[1]
        head = 2 * size + 2 * size * rows
        block = self.blocks.get(size)
        if block is None or block[0] is not state:
            block = (state, np.full(inputs.per_step.shape[0], -1, dtype=np.int64))
            self.blocks[size] = block
        values = block[1]
        table, row = state.step_row(ahead)
        values[:head] = self._tabulated(size, state, table, window)[row]
        history = values[head:].reshape(size * rows, window)
        history[: num * rows, : state.history.shape[2]] = state.history.reshape(num * rows, -1)
        self.staging.send(values, inputs.per_step)

    def _tabulated(self, size: int, state: DecodeBatch, table: StepTable, window: int) -> np.ndarray:
        """[K, 2 * size + 2 * R] the heads of the per-step blocks of the table's K steps (see StepInputs), built
        once per table: positions, seed bits, EOS mask (a slot's value on each of its rows) and ring columns (the
        scratch column where a row's input goes to no ring)."""
        cached = self.tabulated.get(size)
        if cached is not None and cached[0] is table and cached[1] == window:
            return cached[2]
        num, rows, scratch = len(state), state.rows, window - 1
        heads = np.zeros((table.positions.shape[0], 2 * size + 2 * size * rows), dtype=np.int64)
        heads[:, :num] = table.positions
        heads[:, size: size + num] = table.seeds.view(np.int64)
        heads[:, 2 * size: 2 * size + num * rows] = np.repeat(table.below, rows, axis=1)
        ring = 2 * size + size * rows
        heads[:, ring:] = scratch
        heads[:, ring: ring + num * rows] = np.repeat(np.where(table.columns < 0, scratch, table.columns), rows, axis=1)
        self.tabulated[size] = (table, window, heads)
        return heads

    def _replay(self, size: int, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.capture:
            return self.fn(inputs)
        if size not in self.graphs:
            side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch leaves Stream() unannotated
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.fn(self.padding_like(inputs))  # compiles what the capture needs
            torch.cuda.current_stream().wait_stream(side)
            self.pool = self.pool if self.pool is not None else torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = self.fn(inputs)
            self.graphs[size] = (graph, outputs)
        graph, outputs = self.graphs[size]
        graph.replay()
        return outputs


def steady_step(embed: Embed, layers: Callable[..., torch.Tensor], sampler: DeviceSampler, act_dtype: torch.dtype,
                block_size: int, rows: int) -> StepFn:
    """The device work of a steady decode step on StepInputs, device tensors only (what one graph captures), seven
    launches and five a layer: the embedding gather with the slots and context lengths (one kernel), the layers
    (the final norm writing fp32), the code heads (one GEMM), temperature + penalty (one kernel) and top-p + top-k
    with the draw (one kernel, which also writes the next step's ids)."""
    from chattts_velocity.model.kernels.triton import embedding  # imports triton: only when chosen

    def step(inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        positions, tables, size = inputs.positions, inputs.tables, inputs.ids.shape[0]
        # the input ids join the penalty ring in the same kernel (a no-op where the host's history has them already;
        # rows of no ring write the scratch column, which the penalty does not read)
        embeds, slots, context = embedding.decode_inputs(inputs.ids, embed.code_table(), positions, tables,
                                                         block_size, act_dtype, ring=(inputs.history, inputs.ring_cols))
        last = layers(embeds, positions, DecodeMetadata(slots, tables, context), out=inputs.hidden[:size])
        logits = embed.logits_rowwise(inputs.hidden, "code")[:size]  # [size, rows, V]
        processed, top = sampler.draw_inputs(logits.reshape(-1, logits.shape[-1]), inputs.row_params(rows))
        tokens: torch.Tensor = sampler.ops.sample(processed, inputs.seeds, rows, inputs.mask_eos, inputs.eos_ids,
                                                  inputs.ids, **top)  # ids: the next step's embedding ids
        return tokens, last

    return step
