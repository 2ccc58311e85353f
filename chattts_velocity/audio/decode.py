"""Audio stage: batch decoding for the pipeline (per-request hiddens/codes -> per-request waveforms).

Every row runs its own Decoder + Vocos pass, of its own shape: exactly (2*T_i - 1) * 256 samples, the same bits
whatever other rows are decoded with it (oneDNN and BLAS choose their convolution and GEMM kernels, and so their
summation order, from the batch's shape; upstream's one padded batch also changes a shorter row's last ~100
frames). The cost of giving up the shared batch is in docs/fidelity.md.
`dtype=torch.bfloat16` runs bf16 products with float32 sums: on a CPU with the C++ kernels audio/cpu_decode.py's
paths (oneDNN bf16 where the CPU computes bf16, else 16-bit weights in fp32 arithmetic, every row's frames in one
batch-invariant pass), elsewhere the modules under autocast (the iSTFT and the output stay
float32); the default None is the exact float32 path. Everything stays on
the modules' device until the final waveforms, copied to the host once per batch.
"""
from __future__ import annotations

import copy
from typing import TypeVar

import numpy as np
import torch
from torch import nn

from chattts_velocity.audio import cpu_decode
from chattts_velocity.audio.dvae import DVAE, Decoder
from chattts_velocity.audio.vocos import Vocos

M = TypeVar("M", bound=nn.Module)


def cast_for_autocast(module: M, dtype: torch.dtype | None) -> M:
    """The module itself for float32 (None); else a copy whose Conv1d / Linear weights and biases already are
    `dtype`, which is all autocast casts of them, on every call: the same numbers without the casts (5-12 % of a
    bf16 Decoder + Vocos pass on CPU). Other parameters stay float32."""
    if dtype in (None, torch.float32):
        return module
    cast = copy.deepcopy(module)
    for layer in cast.modules():
        if isinstance(layer, (nn.Conv1d, nn.Linear)):
            layer.to(dtype)
    return cast


def pad_batch(rows: list[torch.Tensor], device: torch.device) -> torch.Tensor:  # [T_i, C] -> [B, C, T_max]
    """Zero-pad time-major rows into one channels-first batch (pads are 0.0 or code 0)."""
    widths = {r.shape[1] for r in rows}
    if len(widths) != 1:
        raise ValueError(f"rows: every item must have the same channel count, got {sorted(widths)}")
    t_max = max(r.shape[0] for r in rows)
    batch = torch.zeros(len(rows), rows[0].shape[1], t_max, dtype=rows[0].dtype, device=device)
    for i, r in enumerate(rows):
        batch[i, :, : r.shape[0]] = r.transpose(0, 1).to(device)
    return batch


def _decode_alone(mel_model: Decoder | DVAE, vocos: Vocos, row: torch.Tensor) -> torch.Tensor:
    """One row [T, C] -> its waveform [(2T - 1) * 256] in a Decoder + Vocos pass of its own."""
    mel = mel_model(row.transpose(0, 1)[None].to(mel_model.coef.device)).float()  # [1, n_mels, 2T]
    wav: torch.Tensor = vocos(mel.to(vocos.head.istft.window.device))
    return wav.float()[0]


def _decode_rows(
    mel_model: Decoder | DVAE, vocos: Vocos, rows: list[torch.Tensor], dtype: torch.dtype | None = None
) -> list[np.ndarray]:
    widths = {r.shape[1] for r in rows}
    if len(widths) > 1:
        raise ValueError(f"rows: every item must have the same channel count, got {sorted(widths)}")
    device = mel_model.coef.device
    if cpu_decode.runs(device, dtype) and vocos.head.istft.window.device == device:
        decoded = iter(cpu_decode.decode(mel_model, vocos, [r for r in rows if r.shape[0]]))
        wavs = [next(decoded) if r.shape[0] else None for r in rows]
    else:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype not in (None, torch.float32)):
            wavs = [_decode_alone(mel_model, vocos, r) if r.shape[0] else None for r in rows]
    done = [w for w in wavs if w is not None]
    flat = torch.cat(done).cpu().numpy() if done else np.zeros(0, dtype=np.float32)  # one copy to the host
    out, start = [], 0
    for w in wavs:
        n = 0 if w is None else w.shape[0]
        out.append(flat[start: start + n].copy())
        start += n
    return out


@torch.inference_mode()
def decode_hidden_batch(
    decoder: Decoder, vocos: Vocos, hiddens: list[torch.Tensor], dtype: torch.dtype | None = None
) -> list[np.ndarray]:
    """GPT hidden states [T_i, H] per request -> float32 waveforms of (2*T_i - 1) * 256 samples."""
    bad = [tuple(h.shape) for h in hiddens if h.dim() != 2]
    if bad:
        raise ValueError(f"hiddens: every item must be [T, H], got shapes {bad}")
    return _decode_rows(decoder, vocos, [h.float() for h in hiddens], dtype)


@torch.inference_mode()
def decode_codes_batch(
    dvae: DVAE, vocos: Vocos, codes: list[torch.Tensor], dtype: torch.dtype | None = None
) -> list[np.ndarray]:
    """Audio codes [T_i, 4] per request -> float32 waveforms of (2*T_i - 1) * 256 samples."""
    bad = [tuple(c.shape) for c in codes if c.dim() != 2 or c.shape[1] != dvae.vq_layer.num_codes]
    if bad:
        raise ValueError(f"codes: every item must be [T, {dvae.vq_layer.num_codes}], got shapes {bad}")
    return _decode_rows(dvae, vocos, [c.long() for c in codes], dtype)
