"""Audio stage: ChatTTS's grouped residual FSQ (codes [B, G*R, T] <-> features [B, D, T]).

The numbers of the reference depend on the installed vector_quantize_pytorch (its GFSQ rounding changed between
releases), so the algorithm is chosen with `FSQVariant`. Default: VQP_1_18_5 (what ChatTTS HEAD ran against), i.e.
decode scales (1, 1/4) and an encoder without the initial tanh bound, rounding half to even. VQP_1_12 adds the
initial bound tanh(z)*2.002 (training era); VQP_1_26 is >= 1.26: scales (1, 1/5), an initial
tanh(z/1.25)*1.25, clamp to [-1, 1] and floor(x + 0.5) rounding. Only odd levels are supported.
Code-channel order is c = g*R + r; index = sum_d l_d * prod(levels[:d]); code value = (l - L//2) / (L//2).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum
from typing import cast

import torch
from torch import nn

from chattts_velocity.audio.loading import count_indexed, shape_of


class FSQVariant(Enum):
    VQP_1_12 = "1.12.5-1.18.3"
    VQP_1_18_5 = "1.18.5-1.25.2"
    VQP_1_26 = "1.26+"


def stage_scales(levels: torch.Tensor, num_quantizers: int, variant: FSQVariant) -> torch.Tensor:
    """[R, d] float32: stage r works at scale base**-r, base = L-1 (<1.26) or L (>=1.26)."""
    base = levels.float() if variant is FSQVariant.VQP_1_26 else (levels - 1).float()
    return torch.stack([base ** -r for r in range(num_quantizers)])


def _levels_bounded(u: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """<1.26 stage: integer offsets round(tanh(u) * (L-1)*(1+1e-3)/2), in [-L//2, L//2]."""
    half_l = (levels - 1) * (1 + 1e-3) / 2
    return torch.round(torch.tanh(u) * half_l)  # round half to even


def _levels_symmetric(u: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """>=1.26 stage: floor((L-1)*(clamp(u)+1)/2 + 0.5) - L//2."""
    bracket = (levels - 1) * (u.clamp(-1.0, 1.0) + 1) / 2.0 + 0.5
    return torch.floor(bracket) - levels // 2


class ResidualFSQ(nn.Module):
    """One group: Linear(dim -> d) -> R residual FSQ stages -> Linear(d -> dim)."""

    levels: torch.Tensor  # [d] int64, buffers registered in __init__
    basis: torch.Tensor  # [d] int64
    scales: torch.Tensor  # [R, d]

    def __init__(self, dim: int, levels: tuple[int, ...], num_quantizers: int, variant: FSQVariant) -> None:
        super().__init__()
        if any(level % 2 == 0 or level < 3 for level in levels):
            raise ValueError(f"levels: only odd levels >= 3 are supported, got {levels}")
        self.project_in = nn.Linear(dim, len(levels))
        self.project_out = nn.Linear(len(levels), dim)
        self.variant = variant
        self.num_quantizers = num_quantizers
        self.codebook_size = math.prod(levels)
        lv = torch.tensor(levels, dtype=torch.int64)
        basis = torch.cumprod(torch.tensor((1, *levels[:-1]), dtype=torch.int64), 0)
        self.register_buffer("levels", lv, persistent=False)
        self.register_buffer("basis", basis, persistent=False)
        self.register_buffer("scales", stage_scales(lv, num_quantizers, variant), persistent=False)

    def quantize(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., R] int32
        z = self.project_in(x)  # [..., d]
        if self.variant is FSQVariant.VQP_1_12:
            residual = torch.tanh(z) * ((self.levels - 1) * (1 + 1e-3) / 2)
        elif self.variant is FSQVariant.VQP_1_26:
            clamp = 1 + 1 / (self.levels - 1).float()
            residual = torch.tanh(z / clamp) * clamp
        else:
            residual = z
        half = self.levels // 2
        stage = _levels_symmetric if self.variant is FSQVariant.VQP_1_26 else _levels_bounded
        indices = []
        for r in range(self.num_quantizers):
            offset = stage(residual / self.scales[r], self.levels)  # [..., d] in [-half, half]
            residual = residual - (offset / half) * self.scales[r]
            indices.append(((offset + half).long() * self.basis).sum(-1))
        return torch.stack(indices, -1).to(torch.int32)

    def dequantize(self, indices: torch.Tensor) -> torch.Tensor:  # [..., R] int -> [..., dim]
        half = self.levels // 2
        level = indices.long().unsqueeze(-1) // self.basis % self.levels  # [..., R, d]
        codes = (level - half) / half
        features: torch.Tensor = self.project_out((codes * self.scales).sum(-2))
        return features


class GroupedResidualFSQ(nn.Module):
    """G independent ResidualFSQ groups, each on a dim/G channel slice."""

    def __init__(self, dim: int, levels: tuple[int, ...], num_quantizers: int, groups: int,
                 variant: FSQVariant) -> None:
        super().__init__()
        if dim % groups:
            raise ValueError(f"GFSQ: dim {dim} is not divisible by groups {groups}")
        # a ModuleList (keys rvqs.i.*), typed by what it holds
        self.rvqs = cast(Sequence[ResidualFSQ], nn.ModuleList(
            ResidualFSQ(dim // groups, levels, num_quantizers, variant) for _ in range(groups)
        ))

    def quantize(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, dim] -> [B, T, G*R]
        chunks = x.chunk(len(self.rvqs), dim=-1)
        return torch.cat([rvq.quantize(c) for rvq, c in zip(self.rvqs, chunks, strict=True)], -1)

    def dequantize(self, codes: torch.Tensor) -> torch.Tensor:  # [B, T, G*R] -> [B, T, dim]
        chunks = codes.chunk(len(self.rvqs), dim=-1)
        return torch.cat([rvq.dequantize(c) for rvq, c in zip(self.rvqs, chunks, strict=True)], -1)


class GFSQ(nn.Module):
    """Channels-first wrapper: codes [B, G*R, T] <-> features [B, dim, T]."""

    def __init__(self, dim: int, levels: tuple[int, ...] = (5, 5, 5, 5), num_quantizers: int = 2,
                 groups: int = 2, variant: FSQVariant = FSQVariant.VQP_1_18_5) -> None:
        super().__init__()
        self.quantizer = GroupedResidualFSQ(dim, levels, num_quantizers, groups, variant)
        self.num_codes = groups * num_quantizers
        self.codebook_size = math.prod(levels)

    @classmethod
    def sized_like(cls, sd: dict[str, torch.Tensor], prefix: str, what: str,
                   levels: tuple[int, ...] = (5, 5, 5, 5), num_quantizers: int = 2,
                   variant: FSQVariant = FSQVariant.VQP_1_18_5) -> GFSQ:
        groups = count_indexed(sd, f"{prefix}quantizer.rvqs.", what)
        d, group_dim = shape_of(sd, f"{prefix}quantizer.rvqs.0.project_in.weight", what)
        if d != len(levels):
            raise ValueError(f"{what}: project_in has {d} outputs but levels {levels} has {len(levels)}")
        return cls(group_dim * groups, levels, num_quantizers, groups, variant)

    def encode(self, x: torch.Tensor) -> torch.Tensor:  # [B, dim, T] -> [B, G*R, T] int32
        return self.quantizer.quantize(x.transpose(1, 2)).transpose(1, 2)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:  # [B, G*R, T] int -> [B, dim, T]
        if codes.dim() != 3 or codes.shape[1] != self.num_codes:
            raise ValueError(f"codes: expected [B, {self.num_codes}, T], got {tuple(codes.shape)}")
        if codes.numel() and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise ValueError(f"codes: values must be in [0, {self.codebook_size}) (audio EOS excluded)")
        return self.quantizer.dequantize(codes.transpose(1, 2)).transpose(1, 2)
