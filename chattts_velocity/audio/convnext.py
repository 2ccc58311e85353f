"""Audio stage: the ConvNeXt block shared by the DVAE/Decoder conv stacks and the Vocos backbone.

Tensors in and out are channels-first `[B, C, T]`. ChatTTS names the layer scale `weight`, Vocos `gamma`.
"""
from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from chattts_velocity.audio.loading import count_indexed, shape_of


def masked(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:  # [B, C, T] * [B, 1, T] -> [B, C, T]
    """Zero each row's frames past its end, so the next conv reads the zeros its own padding gives a row alone."""
    return x if mask is None else x * mask.to(x.dtype)


class ConvNeXtBlock(nn.Module):
    """Depthwise conv -> LayerNorm -> Linear -> GELU -> Linear -> per-channel scale -> + residual."""

    def __init__(self, dim: int, intermediate_dim: int, kernel: int = 7, dilation: int = 1,
                 layer_scale_name: str = "weight") -> None:
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel, padding=dilation * (kernel // 2),
                                dilation=dilation, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, intermediate_dim)
        self.pwconv2 = nn.Linear(intermediate_dim, dim)
        self.layer_scale_name = layer_scale_name
        self.register_parameter(layer_scale_name, nn.Parameter(torch.ones(dim)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, C, T] -> [B, C, T]
        y: torch.Tensor = self.dwconv(x).transpose(1, 2)  # [B, T, C]
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        y = y * getattr(self, self.layer_scale_name)
        return x + y.transpose(1, 2)


class ConvNeXtStack(nn.Module):
    """ChatTTS's conv net (upstream `DVAEDecoder`), used as DVAE encoder/decoder and as the Decoder.

    Conv1d(idim->bn_dim, k3) -> GELU -> Conv1d(bn_dim->hidden, k3) -> n_layer ConvNeXt blocks
    (kernel 7, dilation 2) -> Conv1d(hidden->odim, k1, no bias).
    """

    def __init__(self, idim: int, odim: int, bn_dim: int, hidden: int, intermediate_dim: int,
                 n_layer: int, kernel: int = 7, dilation: int = 2) -> None:
        super().__init__()
        self.conv_in = nn.Sequential(
            nn.Conv1d(idim, bn_dim, 3, 1, 1), nn.GELU(), nn.Conv1d(bn_dim, hidden, 3, 1, 1)
        )
        self.decoder_block = nn.ModuleList(
            ConvNeXtBlock(hidden, intermediate_dim, kernel, dilation, "weight") for _ in range(n_layer)
        )
        self.conv_out = nn.Conv1d(hidden, odim, 1, bias=False)

    @property
    def idim(self) -> int:
        return cast(nn.Conv1d, self.conv_in[0]).in_channels

    @property
    def odim(self) -> int:
        return self.conv_out.out_channels

    @classmethod
    def sized_like(cls, sd: dict[str, torch.Tensor], prefix: str, what: str,
                   dilation: int = 2) -> ConvNeXtStack:
        """An unloaded stack whose sizes are read from the `<prefix>*` shapes of sd."""
        bn_dim, idim, _ = shape_of(sd, f"{prefix}conv_in.0.weight", what)
        hidden = shape_of(sd, f"{prefix}conv_in.2.weight", what)[0]
        odim = shape_of(sd, f"{prefix}conv_out.weight", what)[0]
        n_layer = count_indexed(sd, f"{prefix}decoder_block.", what)
        kernel = shape_of(sd, f"{prefix}decoder_block.0.dwconv.weight", what)[2]
        inter = shape_of(sd, f"{prefix}decoder_block.0.pwconv1.weight", what)[0]
        return cls(idim, odim, bn_dim, hidden, inter, n_layer, kernel, dilation)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, idim, T] -> [B, odim, T]; mask [B, 1, T] (1 inside a row, 0 past its end) makes each row's frames
        what they are decoded alone."""
        conv0, gelu, conv1 = self.conv_in
        y = conv1(masked(gelu(conv0(masked(x, mask))), mask))  # [B, hidden, T]
        for block in self.decoder_block:
            y = block(masked(y, mask))
        out: torch.Tensor = self.conv_out(y)  # [B, odim, T]
        return out
