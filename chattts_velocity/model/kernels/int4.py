"""Model stage, CPU kernels: the int4 weights' tile layout and the Q8 activations linear_int4 multiplies them by
(cpu_linear.cpp, q8_rows.h), in torch: for packing, unpacking and the tests' reference."""
from __future__ import annotations

import torch

INT4_GROUP = 32  # columns per int4 scale


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] fp32 (in % 32 == 0) -> q [out, in] int8 in [-7, 7] and fp32 scales [out, in/32]:
    weight ~= q * scale of its 32-column group, scale = absmax / 7 (symmetric)."""
    out, cols = weight.shape
    if cols % INT4_GROUP:
        raise ValueError(f"PackedLinear: int4 needs in_features % {INT4_GROUP} == 0, got {cols}")
    groups = weight.reshape(out, cols // INT4_GROUP, INT4_GROUP)
    scales = (groups.abs().amax(dim=2) / 7).clamp(min=1e-12)  # [out, in/32]
    q = torch.round(groups / scales[..., None]).clamp(-7, 7).to(torch.int8).reshape(out, cols)
    return q, scales


def to_int4_tiles(q: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int4 values q [N, K] (int8 in [-8, 7]) and fp32 scales [N, K/32] -> the layout cpu_linear.cpp's linear_int4
    streams: uint8 [N/4, K/32, 4, 16] (byte j of a group: q + 8 of column j in the low nibble, of column j + 16 in the
    high one) and scales [N/4, K/32, 4] (N % 4 == K % 32 == 0)."""
    n, k = q.shape
    groups = (q.to(torch.int16) + 8).to(torch.uint8).reshape(n, k // 32, 2, 16)
    packed = groups[:, :, 0] | (groups[:, :, 1] << 4)  # [N, K/32, 16]
    tiles = packed.reshape(n // 4, 4, k // 32, 16).transpose(1, 2).contiguous()
    return tiles, scales.float().reshape(n // 4, 4, k // 32).transpose(1, 2).contiguous()


def quantize_q8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What linear_int4 multiplies the int4 weights with (q8_rows.h): x [M, K] (K % 32 == 0) as int8 q [M, K] and
    fp32 scales [M, K/32], per row and 32-column group scale = max |x| / 127 and q = x / scale rounded half to even
    (0 for an all-zero group). x ~= q * scale of its group."""
    m, k = x.shape
    groups = x.float().reshape(m, k // INT4_GROUP, INT4_GROUP)
    scales = groups.abs().amax(dim=2) / 127
    q = torch.where(scales[..., None] > 0, torch.round(groups / scales[..., None].clamp(min=1e-30)), 0.0)
    return q.to(torch.int8).reshape(m, k), scales


def from_int4_tiles(tiles: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of to_int4_tiles: (q [N, K] int8, scales [N, K/32] fp32)."""
    n4, groups = tiles.shape[:2]
    packed = tiles.transpose(1, 2).reshape(n4 * 4, groups, 16)
    low, high = (packed & 0x0F).to(torch.int8) - 8, (packed >> 4).to(torch.int8) - 8
    q = torch.stack([low, high], dim=2).reshape(n4 * 4, groups * 32)
    return q, scales.transpose(1, 2).reshape(n4 * 4, groups)
