"""Audio stage on CPUs without bf16 arithmetic (AVX2): Decoder / DVAE + Vocos on 16-bit weights, every row at once.

The linears' weights are stored in bf16 (half of float32's bytes) and widened to fp32 in registers; activations,
sums, norms, the residual stream and the iSTFT stay float32 (`kernels.ops().audio_linear`, model/kernels/
cpu_audio_linear.cpp). The rows of a batch are concatenated frame after frame (no padding, no redundant frames), so
each linear is one call over every row's frames; the depthwise conv + LayerNorm (`dwconv_norm_rows`) and the k3 / k7
windows stop at each row's own ends.

Batch invariance: each output of the C++ linear is one fixed chain of fp32 FMAs whatever the number of frames, and
every other op is per frame (LayerNorm) or per row (windows, iSTFT), so a row's bits are the same alone and among
others. Numbers: only the weights are rounded (to bf16); tests/audio/test_cpu_panels.py bounds the waveform's SNR
against float32.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from chattts_velocity.audio.convnext import ConvNeXtBlock, ConvNeXtStack
from chattts_velocity.audio.dvae import DVAE, Decoder
from chattts_velocity.audio.vocos import Vocos
from chattts_velocity.model import kernels

PANEL = 16  # outputs per weight panel (cpu_audio_linear.cpp)


def to_panels(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] -> [ceil(N / 16), K, 16] bf16, outputs zero-padded to whole panels."""
    n, k = weight.shape
    padded = F.pad(weight.detach().to(torch.bfloat16), (0, 0, 0, -n % PANEL))
    return padded.reshape(-1, PANEL, k).transpose(1, 2).contiguous()


def _padded(v: torch.Tensor | None, n: int) -> torch.Tensor:  # [n] -> [ceil(n / 16) * 16] float32, zeros after
    values = torch.zeros(n) if v is None else v.detach().float().reshape(-1)
    return F.pad(values, (0, -n % PANEL)).contiguous()


@dataclass(frozen=True)
class PanelLinear:
    panels: torch.Tensor  # [ceil(N / 16), K, 16] bf16
    bias: torch.Tensor  # [ceil(N / 16) * 16] float32
    n: int

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> PanelLinear:
        return cls(to_panels(weight), _padded(bias, weight.shape[0]), weight.shape[0])

    @classmethod
    def of_conv(cls, conv: nn.Conv1d) -> PanelLinear:
        """A stride-1, dilation-1 Conv1d as a linear over windows [k * C_in] in (tap, channel) order."""
        return cls.of(conv.weight.detach().permute(0, 2, 1).reshape(conv.out_channels, -1), conv.bias)

    def __call__(self, x: torch.Tensor, gelu: bool = False) -> torch.Tensor:  # [M, K] -> [M, N] float32
        out: torch.Tensor = kernels.ops().audio_linear(x, self.panels, self.bias, self.n, gelu)
        return out


def windows(x: torch.Tensor, offsets: list[int], k: int) -> torch.Tensor:  # [M, C] -> [M, k * C] float32
    """Per row [offsets[i], offsets[i + 1]): frame t's window t - k//2 .. t + k//2, zeros past the row's ends."""
    c = x.shape[1]
    parts = []
    for a, b in zip(offsets, offsets[1:], strict=False):
        padded = F.pad(x[a:b], (0, 0, k // 2, k // 2))
        parts.append(padded.as_strided((b - a, k * c), (c, 1)))
    return torch.cat(parts)


@dataclass(frozen=True)
class PanelBlock:
    """One ConvNeXt block over concatenated rows: x += gamma * down(gelu(up(norm(dwconv(x))))), in place."""

    dw_weight: torch.Tensor  # [k, C] float32
    dw_bias: torch.Tensor
    dilation: int
    norm_weight: torch.Tensor
    norm_bias: torch.Tensor
    eps: float
    up: PanelLinear
    down: PanelLinear
    gamma: torch.Tensor  # [C] float32, zero-padded to the panels

    @classmethod
    def of(cls, block: ConvNeXtBlock) -> PanelBlock:
        conv = block.dwconv
        return cls(_f32(conv.weight)[:, 0].T.contiguous(), _f32(conv.bias), conv.dilation[0], _f32(block.norm.weight),
                   _f32(block.norm.bias), block.norm.eps, PanelLinear.of(block.pwconv1.weight, block.pwconv1.bias),
                   PanelLinear.of(block.pwconv2.weight, block.pwconv2.bias),
                   _padded(getattr(block, block.layer_scale_name), block.pwconv2.weight.shape[0]))

    def __call__(self, x: torch.Tensor, offsets: torch.Tensor) -> None:  # x [M, C] float32
        ops: Any = kernels.ops()
        h = ops.dwconv_norm_rows(x, offsets, self.dw_weight, self.dw_bias, self.dilation, self.norm_weight,
                                 self.norm_bias, self.eps)
        ops.audio_linear_add_(x, self.up(h, gelu=True), self.down.panels, self.down.bias, self.gamma)


@dataclass(frozen=True)
class PanelStack:
    """A Decoder's or DVAE's ConvNeXt stack and mel head: frames [2T, idim] per row -> mel [2T, n_mels]."""

    conv_in: tuple[PanelLinear, PanelLinear]
    kernel_in: tuple[int, int]
    blocks: tuple[PanelBlock, ...]
    conv_out: PanelLinear
    out_conv: PanelLinear
    kernel_out: int
    coef: torch.Tensor  # [n_mels] float32

    @classmethod
    def of(cls, stack: ConvNeXtStack, out_conv: nn.Conv1d, coef: torch.Tensor) -> PanelStack:
        conv0, conv1 = stack.conv_in[0], stack.conv_in[2]
        assert isinstance(conv0, nn.Conv1d) and isinstance(conv1, nn.Conv1d)
        return cls((PanelLinear.of_conv(conv0), PanelLinear.of_conv(conv1)),
                   (conv0.kernel_size[0], conv1.kernel_size[0]),
                   tuple(PanelBlock.of(b) for b in stack.decoder_block),  # type: ignore[arg-type]  # ModuleList
                   PanelLinear.of_conv(stack.conv_out), PanelLinear.of_conv(out_conv), out_conv.kernel_size[0],
                   coef.detach().float().reshape(-1))

    def __call__(self, frames: torch.Tensor, offsets: list[int]) -> torch.Tensor:  # [M, idim] -> [M, n_mels]
        (first, second), (k0, k1) = self.conv_in, self.kernel_in
        x = second(windows(first(windows(frames, offsets, k0), gelu=True), offsets, k1))
        bounds = torch.tensor(offsets, dtype=torch.int64)
        for block in self.blocks:
            block(x, bounds)
        return self.out_conv(windows(self.conv_out(x), offsets, self.kernel_out)) * self.coef


@dataclass(frozen=True)
class PanelVocos:
    """Vocos' backbone and head linear: mel [F, n_mels] per row -> the head's output [F, n_fft + 2]."""

    embed: PanelLinear
    kernel: int
    norm: nn.LayerNorm
    blocks: tuple[PanelBlock, ...]
    final_norm: nn.LayerNorm
    head: PanelLinear

    @classmethod
    def of(cls, vocos: Vocos) -> PanelVocos:
        bb = vocos.backbone
        return cls(PanelLinear.of_conv(bb.embed), bb.embed.kernel_size[0], _f32_norm(bb.norm),
                   tuple(PanelBlock.of(b) for b in bb.convnext),  # type: ignore[arg-type]  # ModuleList
                   _f32_norm(bb.final_layer_norm), PanelLinear.of(vocos.head.out.weight, vocos.head.out.bias))

    def __call__(self, mel: torch.Tensor, offsets: list[int]) -> torch.Tensor:  # [M, n_mels] -> [M, n_fft + 2]
        x = self.norm(self.embed(windows(mel, offsets, self.kernel)))
        bounds = torch.tensor(offsets, dtype=torch.int64)
        for block in self.blocks:
            block(x, bounds)
        return self.head(self.final_norm(x))


def _f32(t: torch.Tensor | None) -> torch.Tensor:
    assert t is not None
    return t.detach().float().contiguous()


def _f32_norm(norm: nn.LayerNorm) -> nn.LayerNorm:
    out = nn.LayerNorm(norm.normalized_shape, eps=norm.eps)
    out.load_state_dict({k: v.float() for k, v in norm.state_dict().items()})
    return out


_PACKED: weakref.WeakKeyDictionary[nn.Module, PanelStack | PanelVocos] = weakref.WeakKeyDictionary()


def _stack(model: Decoder | DVAE) -> PanelStack:
    if model not in _PACKED:  # packed once: the module's weights do not change in inference
        _PACKED[model] = PanelStack.of(model.decoder, model.out_conv, model.coef)
    found = _PACKED[model]
    assert isinstance(found, PanelStack)
    return found


def _vocos(vocos: Vocos) -> PanelVocos:
    if vocos not in _PACKED:
        _PACKED[vocos] = PanelVocos.of(vocos)
    found = _PACKED[vocos]
    assert isinstance(found, PanelVocos)
    return found


def offsets_of(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def mels(model: Decoder | DVAE, rows: list[torch.Tensor]) -> list[torch.Tensor]:
    """Rows of GPT hidden states [T, H] (Decoder) or codes [T, 4] (DVAE), T >= 1 -> their mels [2T, n_mels]."""
    with torch.inference_mode():
        if isinstance(model, Decoder):
            feats = [row.float() for row in rows]  # [T, 2 idim]
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):  # as the module path (its projections may be bf16)
                feats = [model.vq_layer.decode(row.T[None])[0].T.float() for row in rows]
        with torch.autocast("cpu", enabled=False):
            frames = torch.cat([f.reshape(2 * f.shape[0], f.shape[1] // 2) for f in feats])  # step t -> 2t, 2t + 1
            offsets = offsets_of([2 * f.shape[0] for f in feats])
            return list(torch.split(_stack(model)(frames, offsets), [2 * f.shape[0] for f in feats]))


def wavs(vocos: Vocos, mel_rows: list[torch.Tensor]) -> list[torch.Tensor]:
    """Mels [F, n_mels] (F >= 1) -> waveforms [(F - 1) * hop] float32, Vocos' linears over every row at once."""
    with torch.inference_mode(), torch.autocast("cpu", enabled=False):
        lengths = [m.shape[0] for m in mel_rows]
        out = _vocos(vocos)(torch.cat(mel_rows).float().contiguous(), offsets_of(lengths))  # [sum F, n_fft + 2]
        result = []
        for part in torch.split(out, lengths):
            spec = vocos.head.polar(part.T[None])  # [1, n_fft // 2 + 1, F] complex
            result.append(vocos.head.istft(spec)[0])
        return result
