"""Audio stage: incremental streaming decode, GPT hidden [n, H] (or codes [n, 4]) per push -> final 24 kHz samples.

Each push decodes only a bounded window (left context + new steps + lookahead) through the Decoder (or DVAE) and
Vocos, so a chunk costs O(chunk + context), never O(prefix). With the default (exact) context the concatenated
output equals the whole-clip decode (`decode_hidden_batch` / `decode_codes_batch` of one row) up to float rounding:
documented tolerance 1e-5 max abs; measured <= 1e-6 (full-size random weights), at chunk joins as in the interior.

Receptive field (full-size numbers; computed from the modules' conv paddings, never hard-coded):
* Decoder / DVAE decoder, in mel frames each side: conv_in k3 + k3 (1 + 1), 12 ConvNeXt dwconv k7 dilation 2
  (12 x 6), out_conv k3 (1): R_mel = 75. The interleave turns step t into mel frames 2t and 2t+1.
* Vocos, in spectral frames each side: embed k7 (3) + 8 ConvNeXt dwconv k7 (8 x 3): R_voc = 27. LayerNorms,
  Linears and the head are per frame.
* ISTFT (n_fft 1024, hop 256, center=True): output block k (samples [256k, 256k + 256)) is the overlap-add of
  frames k-h+1 .. k+h with h = n_fft / (2 hop) = 2, divided by their summed squared windows, so it is final once
  those 4 frames are.
* Block k thus reads decoder-input frames k - D .. k + D + 1 with D = (h - 1) + R_voc + R_mel = 103. Emitting
  steps [s, e) (blocks 2s .. 2e-1) needs steps s - ceil(D/2) .. e - 1 + floor(D/2) + 1: left_context_steps = 52
  and lookahead_steps = 52 (tiny test config: 13 and 13). Windows that touch the clip start or end use those real
  edges, whose zero padding is the whole decode's, so the first and last blocks are exact too.
* Defaults: chunk_steps 24 (upstream's stream batch, 0.5 s); window <= 52 + 24 + 52 = 128 steps; the first audio
  comes after chunk_steps + lookahead_steps = 76 steps. Smaller context lowers latency but is approximate.
  A `ChunkSchedule` (audio/chunk_plan.py; StreamSet sets one) starts with a small first chunk and then doubles the
  chunk up to a maximum, which bounds the redundant work of the context (Decoder 5.3x one pass at 24-step chunks,
  at most 2x with the speech default).

Windows (`StreamDecoder.push_many` / `flush_many`): every window emits exactly its scheduled chunk, so its shape
(left context, chunk, lookahead) depends on its index alone. On a CPU each window is decoded in a Decoder + Vocos
pass of its own shape, so a stream's samples are the same bits whichever other streams are decoded with it (a
shared padded batch changed the last bits: the kernels' summation order follows the batch's shape). On a GPU the
windows of one shape, from any streams, share one Decoder + one Vocos call (audio/window_runner.py: CUDA graphs on
their own stream). A window that ends its clip (a flush) has a real right edge and is decoded as a whole clip (the
masked batch of audio/decode.py, each row as if alone).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from chattts_velocity.audio.chunk_plan import STEP_FRAMES, ChunkSchedule, Span, plan_span
from chattts_velocity.audio.dvae import DVAE, Decoder
from chattts_velocity.audio.vocos import Vocos
from chattts_velocity.audio.window_runner import WindowShape, runner_for, window_shape


def conv_radius(modules: list[nn.Module]) -> int:
    """Frames each side that the stacked same-length Conv1d layers of modules see (sum of their paddings)."""
    radius = 0
    for conv in (m for root in modules for m in root.modules() if isinstance(m, nn.Conv1d)):
        if isinstance(conv.padding, str):  # "same" / "valid": not the explicit paddings summed here
            raise ValueError(f"streaming: conv {conv} has padding {conv.padding!r}, not explicit widths")
        k, d, p, s = conv.kernel_size[0], conv.dilation[0], conv.padding[0], conv.stride[0]
        if s != 1 or 2 * p != d * (k - 1):
            raise ValueError(f"streaming: conv {conv} is not a stride-1 same-length conv")
        radius += p
    return radius


def row_width(mel_model: Decoder | DVAE) -> int:
    """C of the rows [n, C] mel_model reads: the GPT's hidden size (Decoder) or the codebook count (DVAE)."""
    return 2 * mel_model.decoder.idim if isinstance(mel_model, Decoder) else mel_model.vq_layer.num_codes


@dataclass(frozen=True)
class ReceptiveField:
    mel_radius: int  # R_mel: mel frames each side seen by the Decoder / DVAE decoder (+ out_conv)
    voc_radius: int  # R_voc: mel frames each side seen by one Vocos spectral frame
    istft_half: int  # h: block k is the overlap-add of frames k-h+1 .. k+h

    @property
    def reach(self) -> int:
        """D: block k reads decoder-input frames k - D .. k + D + 1."""
        return self.istft_half - 1 + self.voc_radius + self.mel_radius

    @property
    def mel_reach(self) -> int:
        """Mel frames each side of its blocks that Vocos reads (istft_half more on the right)."""
        return self.istft_half - 1 + self.voc_radius

    @property
    def left_steps(self) -> int:
        return math.ceil(self.reach / STEP_FRAMES)

    @property
    def lookahead_steps(self) -> int:
        return self.reach // STEP_FRAMES + 1


def receptive_field(mel_model: Decoder | DVAE, vocos: Vocos) -> ReceptiveField:
    """The exact receptive field of mel_model + vocos, read from their layers."""
    hop, n_fft = vocos.head.istft.hop_length, vocos.head.istft.window.shape[0]
    return ReceptiveField(
        mel_radius=conv_radius([mel_model.decoder, mel_model.out_conv]),
        voc_radius=conv_radius([vocos.backbone]),
        istft_half=math.ceil(n_fft / (2 * hop)),
    )


@dataclass
class Window:
    """The rows [span.first, span.end) of a stream, decoded to emit its steps [span.next, span.stop)."""

    rows: torch.Tensor  # [W, C] hidden (float) or codes (int)
    span: Span


@torch.inference_mode()
def decode_windows(mel_model: Decoder | DVAE, vocos: Vocos, field: ReceptiveField,
                   windows: list[Window]) -> list[np.ndarray]:
    """Samples of each window's blocks. On a CPU every window runs alone (its bits never depend on the others); on a
    GPU windows that go on share one batch per shape (a CUDA graph), and windows that end their clip have real right
    edges and share one masked batch."""
    runner = runner_for(mel_model, vocos)
    hop = vocos.head.istft.hop_length
    if not runner.by_shape:
        return [runner.run_clip_ends([w.span], [w.rows])[0] if w.span.at_end
                else runner.run(window_shape(w.span, field.mel_reach, hop), [w.rows])[0] for w in windows]
    ends = [i for i, w in enumerate(windows) if w.span.at_end]
    going = [i for i, w in enumerate(windows) if not w.span.at_end]
    shapes = {i: window_shape(windows[i].span, field.mel_reach, hop) for i in going}
    groups: dict[WindowShape, list[int]] = {}
    for i in going:
        groups.setdefault(shapes[i], []).append(i)
    out: dict[int, np.ndarray] = {}
    for shape, idx in groups.items():
        wavs = runner.run(shape, [windows[i].rows for i in idx])
        out.update(zip(idx, wavs, strict=True))
    if ends:
        wavs = runner.run_clip_ends([windows[i].span for i in ends], [windows[i].rows for i in ends])
        out.update(zip(ends, wavs, strict=True))
    return [out[i] for i in range(len(windows))]


def _positive(name: str, value: int, minimum: int) -> int:
    if not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value!r}")
    return value


def _check_shared(streams: list[StreamDecoder]) -> None:
    if any(s.mel_model is not streams[0].mel_model or s.vocos is not streams[0].vocos for s in streams):
        raise ValueError("streams: push_many/flush_many need streams built on the same decoder/dvae and vocos")


class StreamDecoder:
    """One stream: push newly generated steps, get the samples that are final; flush at the end."""

    def __init__(self, mel_model: Decoder | DVAE, vocos: Vocos, chunk_steps: int = 24,
                 left_context_steps: int | None = None, lookahead_steps: int | None = None) -> None:
        if not isinstance(mel_model, (Decoder, DVAE)):
            raise ValueError(f"mel_model: expected a Decoder (hidden states) or a DVAE (codes), got "
                             f"{type(mel_model).__name__}")
        self.mel_model, self.vocos = mel_model, vocos
        self.takes_hidden = isinstance(mel_model, Decoder)  # float hidden states [n, H]; else integer codes [n, 4]
        self.field = receptive_field(mel_model, vocos)
        left = self.field.left_steps if left_context_steps is None else left_context_steps
        ahead = self.field.lookahead_steps if lookahead_steps is None else lookahead_steps
        self.left_context_steps = _positive("left_context_steps", left, 0)
        # lookahead >= 1 so a pushed step is never final before we know whether it is the clip's last
        self.schedule = ChunkSchedule(_positive("chunk_steps", chunk_steps, 1),
                                      _positive("lookahead_steps", ahead, 1))
        self.width = row_width(mel_model)
        dtype = torch.float32 if self.takes_hidden else torch.long
        self._rows = torch.zeros(0, self.width, dtype=dtype, device=mel_model.coef.device)  # [n, C]
        self._start = 0  # absolute step of _rows[0]
        self._next = 0  # first step whose samples were not emitted yet
        self._windows = 0  # windows emitted so far (their index picks the next chunk from the schedule)
        self._blocks = 0  # hop-sized sample blocks emitted so far
        self._closed = False

    @property
    def chunk_steps(self) -> int:
        """The steady chunk (the schedule's, before any doubling)."""
        return self.schedule.chunk_steps

    @property
    def lookahead_steps(self) -> int:
        return self.schedule.lookahead_steps

    @property
    def total_steps(self) -> int:
        return self._start + self._rows.shape[0]

    @property
    def emitted_samples(self) -> int:
        return self._blocks * self.vocos.head.istft.hop_length

    def push(self, rows: torch.Tensor) -> np.ndarray:  # [n, C] -> [samples] float32
        """Append newly generated steps; return the samples that became final (maybe none)."""
        return StreamDecoder.push_many([self], [rows])[0]

    def flush(self) -> np.ndarray:  # -> [samples] float32
        """End of stream: return every remaining sample (total (2T - 1) * hop)."""
        return StreamDecoder.flush_many([self])[0]

    @staticmethod
    def push_many(streams: list[StreamDecoder], rows: list[torch.Tensor]) -> list[np.ndarray]:
        """push() for several streams sharing the same modules, decoding their windows in one batch per shape."""
        if len(streams) != len(rows):
            raise ValueError(f"rows: expected one tensor per stream ({len(streams)}), got {len(rows)}")
        _check_shared(streams)
        for stream, r in zip(streams, rows, strict=True):
            stream._check(r)
        for stream, r in zip(streams, rows, strict=True):
            stream._rows = torch.cat([stream._rows, r.detach().to(stream._rows)])  # [n, C]
        return StreamDecoder._run(streams, [s._plan(at_end=False) for s in streams])

    @staticmethod
    def flush_many(streams: list[StreamDecoder]) -> list[np.ndarray]:
        """flush() for several streams sharing the same modules."""
        _check_shared(streams)
        windows = [[] if s._closed else s._plan(at_end=True) for s in streams]
        for s in streams:
            s._closed = True
        return StreamDecoder._run(streams, windows)

    @staticmethod
    def _run(streams: list[StreamDecoder], windows: list[list[Window]]) -> list[np.ndarray]:
        flat = [(i, w) for i, ws in enumerate(windows) for w in ws]
        out = [np.zeros(0, dtype=np.float32) for _ in streams]
        if not flat:
            return out
        first = streams[flat[0][0]]
        wavs = decode_windows(first.mel_model, first.vocos, first.field, [w for _, w in flat])
        for i, ws in enumerate(windows):
            if ws:
                out[i] = np.concatenate([wav for (j, _), wav in zip(flat, wavs, strict=True) if j == i])
                streams[i]._advance(ws)
        return out

    def _check(self, rows: torch.Tensor) -> None:
        if self._closed:
            raise ValueError("stream: flush() was already called; start a new StreamDecoder")
        what = "hidden" if self.takes_hidden else "codes"
        if rows.dim() != 2 or rows.shape[1] != self.width:
            raise ValueError(f"{what}: expected [n, {self.width}] (time-major), got {tuple(rows.shape)}")
        if rows.is_floating_point() != self.takes_hidden:
            raise ValueError(f"{what}: expected {'float hidden states' if self.takes_hidden else 'integer codes'}, "
                             f"got {rows.dtype}")
        size = self.mel_model.vq_layer.codebook_size if isinstance(self.mel_model, DVAE) else None
        if size is not None and rows.numel() and (rows.min() < 0 or rows.max() >= size):
            raise ValueError(f"codes: values must be in [0, {size}); drop the audio EOS step ({size}) first")

    def _plan(self, at_end: bool) -> list[Window]:
        """The windows due now, in order (each emits its schedule's chunk; at the end, one emits the rest)."""
        windows: list[Window] = []
        next_step, total = self._next, self.total_steps
        while (span := plan_span(self.schedule, self._windows + len(windows), next_step, total,
                                 self.left_context_steps, at_end=False)) is not None:
            windows.append(Window(self._rows[span.first - self._start: span.end - self._start], span))
            next_step = span.stop
        last = plan_span(self.schedule, 0, next_step, total, self.left_context_steps, at_end=True) if at_end else None
        if last is not None:
            windows.append(Window(self._rows[last.first - self._start: last.end - self._start], last))
        return windows

    def _advance(self, windows: list[Window]) -> None:
        self._windows += len(windows)
        self._blocks = windows[-1].span.end_block
        self._next = windows[-1].span.stop
        keep = max(self._next - self.left_context_steps, 0)
        self._rows = self._rows[keep - self._start:]
        self._start = keep
