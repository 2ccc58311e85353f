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

Several streams (`StreamDecoder.push_many` / `flush_many`): each window is decoded in a Decoder + Vocos pass of its
own shape, so a stream's samples are the same bits whichever other streams are decoded with it (a shared padded
batch changed the last bits: the kernels' summation order follows the batch's shape).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from chattts_velocity.audio.dvae import DVAE, Decoder
from chattts_velocity.audio.pipeline import pad_batch
from chattts_velocity.audio.vocos import Vocos

STEP_FRAMES = 2  # mel frames per GPT step (the interleave)


def conv_radius(modules: list[nn.Module]) -> int:
    """Frames each side that the stacked same-length Conv1d layers of modules see (sum of their paddings)."""
    radius = 0
    for conv in (m for root in modules for m in root.modules() if isinstance(m, nn.Conv1d)):
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
    """Steps [start, start + len(rows)) to decode; blocks [first_block, end_block) of hop samples to keep."""

    rows: torch.Tensor  # [W, C] hidden (float) or codes (int)
    start: int
    at_end: bool  # the window ends the clip (its right edge is real, so it must not be padded)
    first_block: int
    end_block: int


def _mel_span(w: Window, field: ReceptiveField) -> tuple[int, int]:
    """Absolute mel frames [m0, m1) that Vocos needs for w's blocks, clipped to the window."""
    f0, f1 = STEP_FRAMES * w.start, STEP_FRAMES * (w.start + w.rows.shape[0])
    m0 = w.first_block - (field.istft_half - 1) - field.voc_radius
    m1 = w.end_block + field.istft_half + field.voc_radius
    return max(m0, f0), min(m1, f1)


def _decode_group(mel_model: Decoder | DVAE, vocos: Vocos, field: ReceptiveField,
                  group: list[Window]) -> list[np.ndarray]:
    """One Decoder and one Vocos call for windows that may be right-padded together."""
    mel = mel_model(pad_batch([w.rows for w in group], mel_model.coef.device))  # [B, n_mels, 2 W_max]
    spans = [_mel_span(w, field) for w in group]
    crops = [mel[i, :, m0 - STEP_FRAMES * w.start: m1 - STEP_FRAMES * w.start].T
             for i, (w, (m0, m1)) in enumerate(zip(group, spans, strict=True))]  # [m1 - m0, n_mels] each
    device = vocos.head.istft.window.device
    wavs = vocos(pad_batch(crops, device)).float().cpu().numpy()  # [B, (L_max - 1) * hop]
    hop = vocos.head.istft.hop_length
    # vocos row i starts at clip sample hop * m0_i
    return [wavs[i, hop * (w.first_block - m0): hop * (w.end_block - m0)].copy()
            for i, (w, (m0, _)) in enumerate(zip(group, spans, strict=True))]


@torch.inference_mode()
def decode_windows(mel_model: Decoder | DVAE, vocos: Vocos, field: ReceptiveField,
                   windows: list[Window]) -> list[np.ndarray]:
    """Samples of each window's blocks, each window in a pass of its own (its bits never depend on the others)."""
    return [_decode_group(mel_model, vocos, field, [w])[0] for w in windows]


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
        self.chunk_steps = _positive("chunk_steps", chunk_steps, 1)
        left = self.field.left_steps if left_context_steps is None else left_context_steps
        ahead = self.field.lookahead_steps if lookahead_steps is None else lookahead_steps
        self.left_context_steps = _positive("left_context_steps", left, 0)
        # >= 1 so a pushed step is never final before we know whether it is the clip's last (256 samples only)
        self.lookahead_steps = _positive("lookahead_steps", ahead, 1)
        self.width = row_width(mel_model)
        dtype = torch.float32 if self.takes_hidden else torch.long
        self._rows = torch.zeros(0, self.width, dtype=dtype, device=mel_model.coef.device)  # [n, C]
        self._start = 0  # absolute step of _rows[0]
        self._next = 0  # first step whose samples were not emitted yet
        self._blocks = 0  # hop-sized sample blocks emitted so far
        self._closed = False

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
        """push() for several streams sharing the same modules, decoding their windows in one batch."""
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
        windows = [None if s._closed else s._plan(at_end=True) for s in streams]
        for s in streams:
            s._closed = True
        return StreamDecoder._run(streams, windows)

    @staticmethod
    def _run(streams: list[StreamDecoder], windows: list[Window | None]) -> list[np.ndarray]:
        live = [i for i, w in enumerate(windows) if w is not None]
        out = [np.zeros(0, dtype=np.float32) for _ in streams]
        if not live:
            return out
        first = streams[live[0]]
        wavs = decode_windows(first.mel_model, first.vocos, first.field, [windows[i] for i in live])
        for i, wav in zip(live, wavs, strict=True):
            out[i] = wav
            streams[i]._advance(windows[i])
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
        size = None if self.takes_hidden else self.mel_model.vq_layer.codebook_size
        if size is not None and rows.numel() and (rows.min() < 0 or rows.max() >= size):
            raise ValueError(f"codes: values must be in [0, {size}); drop the audio EOS step ({size}) first")

    def _plan(self, at_end: bool) -> Window | None:
        """The window to decode now, or None if fewer than chunk_steps new steps are final."""
        total = self.total_steps
        stop = total if at_end else total - self.lookahead_steps  # steps [_next, stop) become final
        if stop <= self._next or (not at_end and stop - self._next < self.chunk_steps):
            return None
        first = max(self._next - self.left_context_steps, self._start)
        end_block = STEP_FRAMES * total - 1 if at_end else STEP_FRAMES * stop
        return Window(self._rows[first - self._start:], first, at_end, STEP_FRAMES * self._next, end_block)

    def _advance(self, window: Window) -> None:
        self._blocks = window.end_block
        self._next = math.ceil(window.end_block / STEP_FRAMES)
        keep = max(self._next - self.left_context_steps, 0)
        self._rows = self._rows[keep - self._start:]
        self._start = keep
