"""Engine stage, triton backend: the sampler whose chain runs on the logits' device.

In: the sequences that sample this step and their logits [S*rows, V] on the device. Out: tokens [S, rows] int64 on
the device; the model runner's copy of them is the step's only device-to-host transfer. The per-row parameters are
built on the host (Sampler.prepare, as for every backend) and sent with pinned, non-blocking copies; the chain is
engine/worker/sampling/logits_processors.py's, in its order, through the ops of model/kernels/triton/sampling.py:
    temperature + penalty -> top-p + top-k -> custom processors -> EOS mask + softmax + Philox Exp(1) noise + argmax
Without custom processors, two kernels: temperature + penalty, then one for top-p + top-k (no sort) and the draw.
With them, top-p + top-k is a kernel of its own before them (three launches and theirs).
NOTE (noise): keyed by (seed, step) like Sampler's, so a request's tokens never depend on its batch; but it is
Philox in Triton, not torch's CPU generator: the same distribution, a different stream (a seed's audio differs from
the other backends'). Custom processors are user code: they may sync, and get their history with a blocking copy.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from chattts_velocity.engine.worker.sampling import logits_processors as lp
from chattts_velocity.engine.worker.sampling.sampler import Sampler, SamplingBatch
from chattts_velocity.engine.worker.step_inputs import to_device


class DeviceSampler(Sampler):
    """Sampler's contract (prepare on the host, sample -> [S, rows]) with the chain and the noise on the device."""

    def __init__(self) -> None:
        super().__init__()
        from chattts_velocity.model.kernels.triton import (
            sampling,  # imports triton: only when chosen
        )

        self.ops = sampling
        self._sent: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(host tensor) -> (it, its device copy)

    def _send(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        """tensor on device; the per-request parameters Sampler.prepare reuses while a batch stays the same
        (temperatures, EOS ids, penalties, top-p/top-k) are copied once, not every step."""
        hit = self._sent.get(id(tensor))
        if hit is not None and hit[0] is tensor and hit[1].device == device:
            return hit[1]
        if len(self._sent) >= 64:
            self._sent.clear()
        self._sent[id(tensor)] = (tensor, to_device(tensor, device))
        return self._sent[id(tensor)][1]

    @torch.inference_mode()
    def sample(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """logits [S*rows, V] (any float dtype; not modified) -> tokens [S, rows] int64 on the logits' device."""
        bits = batch.seed_bits
        host_seeds = (self.ops.noise_seeds(batch.noise_seeds, "cpu") if bits is None
                      else torch.from_numpy(bits.view(np.int64)))  # [S] int64, the seeds' bits
        device = logits.device
        params = batch.params
        processed, top = self.draw_inputs(logits, params)
        return self.ops.sample(processed, to_device(host_seeds, device), params.rows_per_seq,
                               to_device(params.mask_eos, device), self._send(params.eos_ids, device), **top)

    @torch.inference_mode()
    def warm_up(self, num_vq: int, audio_vocab: int, text_vocab: int, device: torch.device) -> None:
        """Sample once in code mode (num_vq rows of audio_vocab) and once in text mode (one row of text_vocab),
        penalty and top-p/top-k on, then off (the draw without them), and run the chain alone (top-p + top-k as its
        own kernel, as with custom processors): every sampling kernel variant is compiled before the first
        request."""
        for rows, vocab in ((num_vq, audio_vocab), (1, text_vocab)):
            params = lp.RowParams(rows, torch.ones(rows), torch.zeros(rows, dtype=torch.int64),
                                  torch.zeros(rows, dtype=torch.bool), torch.full((rows,), 1.05),
                                  torch.zeros(rows, 1, dtype=torch.int64), torch.full((rows,), 0.7),
                                  torch.full((rows,), 20, dtype=torch.int64))
            plain = dataclasses.replace(params, top_p=None, top_k=None)
            for each in (params, plain):
                self.sample(torch.zeros(rows, vocab, device=device), SamplingBatch(each, [0]))
            self.process(torch.zeros(rows, vocab, device=device), SamplingBatch(params, [0]))

    @torch.inference_mode()
    def process(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """The processor chain of lp.process on the device: logits [R, V] -> a processed fp32 copy [R, V]."""
        params = batch.params
        processed = self.chain(logits, params)
        masked: torch.Tensor = self.ops.mask_eos(processed, to_device(params.mask_eos, logits.device),
                                                 self._send(params.eos_ids, logits.device))
        return masked

    def chain(self, logits: torch.Tensor, params: lp.RowParams) -> torch.Tensor:
        """The chain but the EOS mask (the draw applies it, after the custom processors): logits [R, V] (any float
        dtype; not modified) -> a processed fp32 copy [R, V]."""
        return self.draw_inputs(logits, params, defer_top=False)[0]

    def draw_inputs(self, logits: torch.Tensor, params: lp.RowParams, defer_top: bool = True,
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(the chain's fp32 copy of logits [R, V], the top_p / top_k arguments left for the draw's kernel or {}).
        top-p + top-k is deferred to the draw where asked and no custom processor needs its output. Without custom
        processors, no host sync: what a captured step runs."""
        ops, device = self.ops, logits.device
        temperatures, history, penalties = _temperature_penalty_args(params)
        processed = ops.apply_temperature_and_penalty(
            logits, self._send(temperatures, device), to_device(history, device), self._send(penalties, device),
            out=torch.empty(logits.shape, dtype=torch.float32, device=device))
        if params.top_p is None and params.top_k is None:
            return lp.apply_custom(processed, params.custom, params.rows_per_seq, params.failures), {}
        top_p, top_k = _top_p_top_k_args(params)
        top = {"top_p": self._send(top_p, device), "top_k": self._send(top_k, device)}
        if defer_top and not params.custom:
            return processed, top
        ops.apply_top_p_top_k(processed, top["top_p"], top["top_k"])
        return lp.apply_custom(processed, params.custom, params.rows_per_seq, params.failures), {}


def _temperature_penalty_args(params: lp.RowParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """temperatures [R], history [R, W] (W = 0 when no row penalises) and penalties [R] on the host."""
    rows = params.temperatures.shape[0]
    if params.penalties is None or params.history is None:
        return params.temperatures, torch.empty(rows, 0, dtype=torch.int64), torch.ones(rows)
    return params.temperatures, params.history, params.penalties


def _top_p_top_k_args(params: lp.RowParams) -> tuple[torch.Tensor, torch.Tensor]:
    """top_p [R] (1.0 = off) and top_k [R] (0 = off) on the host, for a step where at least one row uses either."""
    rows = params.temperatures.shape[0]
    top_p = params.top_p if params.top_p is not None else torch.ones(rows)
    top_k = params.top_k if params.top_k is not None else torch.zeros(rows, dtype=torch.int64)
    return top_p, top_k
