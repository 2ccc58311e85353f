"""Model stage, CPU kernels: the int4 weights' tile layout and the Q8 activations linear_int4 multiplies them by
(cpu_linear.cpp, q8_rows.h), in torch: for packing, unpacking and the tests' reference."""
from __future__ import annotations

import torch

from .pages import on_huge_pages

INT4_GROUP = 32  # columns per int4 scale


# Where a group's signed extreme lands (in units of the scale) in the scales quantize_int4 tries; -8 is llama.cpp's
# Q4_0 rule. Below -8 the extreme clips to -8 for finer steps elsewhere; above it the steps are coarser. Five
# candidates: on Gaussian weights within 0.03 points of the relative RMS error of nine (-9 to -7 by 0.25), each a
# pass over the weights at packing time.
SCALE_CANDIDATES = (-8.0, -8.75, -8.25, -7.75, -7.25)
FIT_CHUNK = 16384  # groups fitted per pass: the passes over one chunk stay in cache


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] fp32 (in % 32 == 0) -> q [out, in] int8 in [-8, 7] and fp32 scales [out, in/32] with
    weight ~= q * scale of its 32-column group, the scale fitted to the group's squared error.

    Per group, for each candidate c of SCALE_CANDIDATES: q = round(w * c / extreme) (extreme: the group's signed
    value of largest magnitude) clamped to [-8, 7], scored with its least-squares scale sum(w q) / sum(q q); the best
    q keeps its least-squares scale. Its squared error is at most that of llama.cpp's Q4_0 rule (c = -8, one of the
    candidates; least squares only lowers it), whose scale maps the extreme to -8 to use all 16 levels."""
    out, cols = weight.shape
    if cols % INT4_GROUP:
        raise ValueError(f"PackedLinear: int4 needs in_features % {INT4_GROUP} == 0, got {cols}")
    groups = weight.float().reshape(-1, INT4_GROUP)
    q = torch.empty(groups.shape, dtype=torch.int8)
    scales = torch.empty(len(groups))
    for start in range(0, len(groups), FIT_CHUNK):
        chunk = slice(start, start + FIT_CHUNK)
        q[chunk], scales[chunk] = _fit_groups(groups[chunk])
    return q.reshape(out, cols), scales.reshape(out, cols // INT4_GROUP)


def _fit_groups(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """groups [G, 32] fp32 -> q [G, 32] int8 and scales [G] as quantize_int4 (all-zero groups: q 0, scale 0)."""
    extreme = groups.gather(1, groups.abs().argmax(1, keepdim=True))  # [G, 1]
    unit = groups / torch.where(extreme == 0, 1.0, extreme)  # [G, 32], 1 at the extreme
    best_score, best = torch.full_like(extreme, -1.0), torch.zeros_like(extreme)
    q = torch.empty_like(groups)
    for candidate in SCALE_CANDIDATES:
        torch.mul(unit, candidate, out=q).round_().clamp_(-8, 7)
        dot, norm = (groups * q).sum(1, keepdim=True), (q * q).sum(1, keepdim=True).clamp_(min=1)
        score = dot * dot / norm  # the squared error is sum(w w) - score at the least-squares scale
        better = score > best_score
        best_score, best = torch.where(better, score, best_score), torch.where(better, candidate, best)
    q = (unit * best).round_().clamp_(-8, 7)
    scales = (groups * q).sum(1) / (q * q).sum(1).clamp_(min=1)
    return q.to(torch.int8), scales


def to_int4_tiles(q: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int4 values q [N, K] (int8 in [-8, 7]) and fp32 scales [N, K/32] -> the layout cpu_linear.cpp's linear_int4
    streams: uint8 [N/4, K/32, 4, 16] (byte j of a group: q + 8 of column j in the low nibble, of column j + 16 in the
    high one) and scales [N/4, K/32, 4] (N % 4 == K % 32 == 0)."""
    n, k = q.shape
    groups = (q.to(torch.int16) + 8).to(torch.uint8).reshape(n, k // 32, 2, 16)
    packed = groups[:, :, 0] | (groups[:, :, 1] << 4)  # [N, K/32, 16]
    tiles = on_huge_pages(packed.reshape(n // 4, 4, k // 32, 16).transpose(1, 2))
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
