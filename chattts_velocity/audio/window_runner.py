"""Audio stage, streaming: same-shape decode windows -> their kept samples, one Decoder + Vocos batch per shape.

In: the rows [W, C] of windows that share a `WindowShape` (audio/chunk_plan.py fixes the shapes by window index).
Out: each window's kept samples, float32 numpy. Without CUDA (or with the modules on two devices) windows run
eagerly, each in a pass of its own shape (streaming.decode_windows: a row's bits never depend on the others). On CUDA
every call runs on the runner's own CUDA stream, which waits for the caller's stream with an event (so the GPT's
stream keeps running beside the audio), and a (shape, batch bucket, autocast) is captured once as a CUDA graph
and replayed after: the batch is zero-padded to the next power of two (rows are independent through
the convolutions, so padding changes no real row), and the graphs share one memory pool, safe because each
replay's output is copied to the host before the next replay. A capture that fails falls back to eager, once.
"""
from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch

from chattts_velocity.audio import cpu_decode
from chattts_velocity.audio.chunk_plan import STEP_FRAMES, Span, mel_span
from chattts_velocity.audio.decode import decode_codes_batch, decode_hidden_batch
from chattts_velocity.audio.dvae import DVAE, Decoder
from chattts_velocity.audio.vocos import Vocos

log = logging.getLogger(__name__)
if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

M = TypeVar("M", bound=torch.nn.Module)


@dataclass(frozen=True)
class WindowShape:
    steps: int  # W: rows decoded
    crop: tuple[int, int]  # mel frames [a, b) of the window that Vocos reads
    keep: tuple[int, int]  # samples [s0, s1) of Vocos' output that are emitted


# a captured graph's key: (shape, batch bucket, the rows' dtype, autocast on, autocast's dtype)
GraphKey = tuple[WindowShape, int, torch.dtype, bool, torch.dtype]


def window_shape(span: Span, mel_reach: int, hop: int) -> WindowShape:
    m0, m1 = mel_span(span, mel_reach)
    f0 = STEP_FRAMES * span.first  # the window's first mel frame; Vocos' output starts at sample hop * m0
    return WindowShape(span.end - span.first, (m0 - f0, m1 - f0),
                       (hop * (STEP_FRAMES * span.next - m0), hop * (span.end_block - m0)))


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype autocast runs on device now, or None when it is off."""
    return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None


def decode_batch(mel_model: Decoder | DVAE, vocos: Vocos, shape: WindowShape,
                 batch: torch.Tensor) -> torch.Tensor:  # [B, C, W] -> [B, s1 - s0] float32
    (a, b), (s0, s1) = shape.crop, shape.keep
    if cpu_decode.runs(mel_model.coef.device, autocast_dtype(mel_model.coef.device)):  # batch-invariant C++ paths
        return torch.stack([wav[s0:s1] for wav in cpu_decode.decode(mel_model, vocos, list(batch.transpose(1, 2)),
                                                                    (a, b))])
    mel = mel_model(batch)  # [B, n_mels, 2 W]
    wav: torch.Tensor = vocos(mel[:, :, a:b])
    return wav.float()[:, s0:s1]


def batch_bucket(rows: int) -> int:
    """The captured batch size that serves `rows` windows: the next power of two."""
    return 1 << max(rows - 1, 0).bit_length()


class _Graph:
    """One captured decode of a fixed [size, C, W] input."""

    def __init__(self, runner: WindowRunner, shape: WindowShape, size: int, like: torch.Tensor) -> None:
        self.input = torch.zeros(size, like.shape[1], shape.steps, dtype=like.dtype, device=like.device)
        enabled, dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
        with torch.autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=False):
            decode_batch(runner.mel_model, runner.vocos, shape, self.input)  # warm-up, on the runner's stream
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=runner.pool, stream=runner.stream):
                self.output = decode_batch(runner.mel_model, runner.vocos, shape, self.input)
        runner.pool = runner.pool or self.graph.pool()

    def run(self, batch: torch.Tensor) -> torch.Tensor:  # [B, C, W] -> [B, s1 - s0]
        self.input[: batch.shape[0]].copy_(batch)
        self.input[batch.shape[0]:].zero_()
        self.graph.replay()
        return self.output[: batch.shape[0]]


class WindowRunner:
    """Decodes batches of windows for one (mel model, Vocos) pair."""

    def __init__(self, mel_model: Decoder | DVAE, vocos: Vocos) -> None:
        # weak references: the runners' table is keyed by the mel model, which a strong reference here would pin
        self._mel_model, self._vocos = weakref.ref(mel_model), weakref.ref(vocos)
        device = mel_model.coef.device
        on_cuda = device.type == "cuda" and vocos.head.istft.window.device == device
        self.stream = torch.cuda.Stream(device) if on_cuda else None  # type: ignore[no-untyped-call]  # unannotated in torch
        self.by_shape = on_cuda  # group windows by shape (what graphs need); else each window alone
        self.pool: _POOL_HANDLE | None = None
        self.graphs: dict[GraphKey, _Graph | None] = {}  # None: capture failed, that key runs eagerly

    @property
    def mel_model(self) -> Decoder | DVAE:
        return _alive(self._mel_model)

    @property
    def vocos(self) -> Vocos:
        return _alive(self._vocos)

    def serves(self, vocos: Vocos) -> bool:
        """Whether this runner decodes through this Vocos (still alive)."""
        return self._vocos() is vocos

    def run(self, shape: WindowShape, rows: list[torch.Tensor]) -> list[np.ndarray]:  # [W, C] each
        """Windows of one shape in one batch (a graph replay on CUDA)."""
        with self._own_stream():
            batch = _stack(rows)
            graph = self._graph(shape, batch) if self.stream is not None else None
            wav = graph.run(batch) if graph else decode_batch(self.mel_model, self.vocos, shape, batch)
            return _to_host(wav)  # on CUDA this waits for the runner's stream only

    def run_clip_ends(self, spans: list[Span], rows: list[torch.Tensor]) -> list[np.ndarray]:
        """Windows that end their clip (real right edges, one-off shapes) in one batch decode of whole clips: the
        masked batch of audio/decode.py gives each what it gives alone; the kept samples are each window's tail."""
        model = self.mel_model
        dtype = autocast_dtype(model.coef.device)
        with self._own_stream():
            wavs = (decode_hidden_batch(model, self.vocos, rows, dtype) if isinstance(model, Decoder)
                    else decode_codes_batch(model, self.vocos, rows, dtype))
        hop = self.vocos.head.istft.hop_length
        return [wav[hop * STEP_FRAMES * (s.next - s.first):] for wav, s in zip(wavs, spans, strict=True)]

    @contextmanager
    def _own_stream(self) -> Iterator[None]:
        """On CUDA: run on the runner's stream once the caller's stream has written the rows; else nothing."""
        if self.stream is None:
            yield
            return
        ready = torch.cuda.Event()  # type: ignore[no-untyped-call]  # unannotated in torch
        ready.record()
        with torch.cuda.device(self.stream.device), torch.cuda.stream(self.stream):
            self.stream.wait_event(ready)
            yield

    def _graph(self, shape: WindowShape, batch: torch.Tensor) -> _Graph | None:
        key: GraphKey = (shape, batch_bucket(batch.shape[0]), batch.dtype, torch.is_autocast_enabled("cuda"),
               torch.get_autocast_dtype("cuda"))
        if key not in self.graphs:
            try:
                self.graphs[key] = _Graph(self, shape, key[1], batch)
            except RuntimeError as error:  # a capture the modules do not allow: decode that shape eagerly
                log.warning("streaming audio: CUDA graph capture of %s failed (%s); decoding it eagerly", key, error)
                self.graphs[key] = None
        return self.graphs[key]


def _alive(ref: weakref.ref[M]) -> M:
    module = ref()
    if module is None:
        raise ValueError("streaming: the decoder or vocos of this stream was freed")
    return module


def _stack(rows: list[torch.Tensor]) -> torch.Tensor:  # [W, C] each -> [B, C, W]
    return torch.stack(rows).transpose(1, 2).contiguous()


def _to_host(wav: torch.Tensor) -> list[np.ndarray]:
    flat = wav.cpu().numpy()
    return [flat[i].copy() for i in range(flat.shape[0])]


_RUNNERS: weakref.WeakKeyDictionary[torch.nn.Module, WindowRunner] = weakref.WeakKeyDictionary()


def runner_for(mel_model: Decoder | DVAE, vocos: Vocos) -> WindowRunner:
    """The one runner of these modules (its graphs serve every stream on them)."""
    runner = _RUNNERS.get(mel_model)
    if runner is None or not runner.serves(vocos):
        runner = _RUNNERS[mel_model] = WindowRunner(mel_model, vocos)
    return runner
