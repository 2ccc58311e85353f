"""Audio stage: batch decoding for the pipeline (per-request hiddens/codes -> per-request waveforms).

Rows are zero-padded to the longest one (as upstream), decoded in one batch, and each row is cut to
exactly (2*T_i - 1) * 256 samples, so a row's audio never carries the padding of longer rows.
`dtype=torch.bfloat16` runs the convolutions and GEMMs under autocast on the modules' device (on CPU about 2x
faster; the iSTFT and the output stay float32); the default None is the exact float32 path. Everything stays on
the modules' device until the final waveforms, copied to the host once per batch.
"""
from __future__ import annotations

import numpy as np
import torch

from chattts_velocity.audio.dvae import DVAE, Decoder
from chattts_velocity.audio.vocos import Vocos


def audio_precision(choice: str | None, gpt_dtype: str, device: torch.device) -> torch.dtype | None:
    """The Decoder's and Vocos's autocast dtype (None = exact float32) for Chat.load's decode_dtype `choice`.

    None picks bfloat16 on CUDA (the GPU default) or with a bfloat16/int8 GPT stage, float32 otherwise.
    """
    if choice is None:
        choice = "bfloat16" if device.type == "cuda" or gpt_dtype in ("bfloat16", "int8") else "float32"
    if choice not in ("bfloat16", "float32"):
        raise ValueError(f"decode_dtype: must be 'bfloat16', 'float32' or None, got {choice!r}")
    return torch.bfloat16 if choice == "bfloat16" else None


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


def _decode_rows(
    mel_model: Decoder | DVAE, vocos: Vocos, rows: list[torch.Tensor], dtype: torch.dtype | None = None
) -> list[np.ndarray]:
    lengths = [r.shape[0] for r in rows]
    if not rows:
        return []
    if max(lengths) == 0:
        return [np.zeros(0, dtype=np.float32) for _ in rows]
    hop = vocos.head.istft.hop_length
    batch = pad_batch(rows, mel_model.coef.device)  # [B, C, T_max]
    device_type = batch.device.type
    with torch.autocast(device_type, dtype=dtype or torch.float32, enabled=dtype not in (None, torch.float32)):
        mel = mel_model(batch).float()  # [B, n_mels, 2*T_max]
        wavs = vocos(mel.to(vocos.head.istft.window.device)).float().cpu().numpy()  # [B, (2*T_max-1)*hop]
    return [wavs[i, : max(2 * t - 1, 0) * hop].copy() for i, t in enumerate(lengths)]


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
