"""Audio stage on the CPU in bf16: Decoder / DVAE + Vocos channels-last, one row [T, C] per pass.

The residual stream stays float32 `[frames, channels]` from the first conv to the last (no transpose per block).
Each ConvNeXt block is three calls: the depthwise conv + LayerNorm fused in C++ (`kernels.ops().dwconv_norm`,
bf16 out), the first pointwise linear with its GELU fused (oneDNN, bf16 weights packed once), the second linear,
then `x += gamma * y` in float32. The k3 / k7 convolutions (conv_in, out_conv, Vocos' embed) are linears over the
frames' windows (im2col, a strided view of the zero-padded rows). The iSTFT is the module's own, in float32.

Batch invariance: each row runs alone, a pass of its own shape, so its bits never depend on other rows (oneDNN picks
its kernels from the shape); within a pass the C++ op computes every frame from its own window in one fixed order.
Numbers: bf16 products and activations, float32 sums, norms, residuals and iSTFT; the same precision as autocast's
bf16 path (tests/audio/test_cpu_decode.py bounds the difference to float32), about 2x faster (benchmarks/
bench_audio_dtype.py --parts). `path()` says which bf16 path runs here: this one where the CPU computes bf16
natively, audio/cpu_panels.py (16-bit weights, fp32 arithmetic, rows batched) on other CPUs with our kernels.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from chattts_velocity.audio import cpu_panels
from chattts_velocity.audio.convnext import ConvNeXtBlock, ConvNeXtStack
from chattts_velocity.audio.dvae import DVAE, Decoder
from chattts_velocity.audio.vocos import Vocos
from chattts_velocity.model import kernels


def runs(device: torch.device, dtype: torch.dtype | None) -> bool:
    """Whether a decode in dtype on device takes a C++ path: bf16 on a CPU where it is available()."""
    return device.type == "cpu" and dtype == torch.bfloat16 and available()


def available() -> bool:
    """Whether this process runs bf16 decodes on a C++ path (path() is not None)."""
    return path() is not None


def path() -> str | None:
    """The bf16 decode's path here: "onednn" (this module: bf16 arithmetic, where the CPU computes bf16 natively and
    oneDNN has bf16), "panels" (audio/cpu_panels.py: 16-bit weights in fp32 arithmetic, every other CPU our kernels
    run on, AVX2 among them), None without the C++ kernels."""
    if kernels.isa() is None or not kernels.load():
        return None
    native = (kernels.native_bf16() and torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
              and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return "onednn" if native else "panels"


def decode(model: Decoder | DVAE, vocos: Vocos, rows: list[torch.Tensor],
           crop: tuple[int, int] | None = None) -> list[torch.Tensor]:
    """Rows [T_i, C] (T_i >= 1) of hidden states (Decoder) or codes (DVAE) -> waveforms float32; crop: the mel
    frames [a, b) of each row that Vocos reads (a stream's window), else all. On the panels path every row's frames
    go through each linear at once; on oneDNN each row runs alone (its kernels depend on the shape)."""
    a, b = crop or (0, None)
    if path() == "panels":
        return cpu_panels.wavs(vocos, [mel[a:b] for mel in cpu_panels.mels(model, rows)])
    return [vocos_wav(vocos, mel_frames(model, row)[a:b]) for row in rows]


@dataclass(frozen=True)
class PackedLinear:
    """A bf16 linear whose weight oneDNN reordered once; `gelu=True` fuses the exact (erf) GELU."""

    weight: torch.Tensor  # [N, K] bf16, oneDNN's layout
    bias: torch.Tensor | None  # [N] bf16

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> PackedLinear:
        w = weight.detach().to(torch.bfloat16).contiguous()
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 256)
        return cls(packed, None if bias is None else bias.detach().to(torch.bfloat16).contiguous())

    @classmethod
    def of_conv(cls, conv: nn.Conv1d) -> PackedLinear:
        """A stride-1, dilation-1 Conv1d as a linear over windows [k * C_in] in (tap, channel) order."""
        w = conv.weight.detach().permute(0, 2, 1).reshape(conv.out_channels, -1)  # [C_out, k * C_in]
        return cls.of(w, conv.bias)

    def __call__(self, x: torch.Tensor, gelu: bool = False) -> torch.Tensor:  # [M, K] bf16 -> [M, N] bf16
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x, self.weight, self.bias, "gelu" if gelu else "none", [], "none" if gelu else "")
        return out


def windows(x: torch.Tensor, k: int) -> torch.Tensor:  # [T, C] -> [T, k * C] bf16, zero-padded k // 2 each side
    """Row t holds frames t - k//2 .. t + k//2 (a strided view of the padded frames, then one copy)."""
    t, c = x.shape
    padded = F.pad(x.to(torch.bfloat16), (0, 0, k // 2, k // 2))
    return padded.as_strided((t, k * c), (c, 1)).contiguous()


@dataclass(frozen=True)
class PackedBlock:
    """One ConvNeXt block, channels-last."""

    dw_weight: torch.Tensor  # [k, C] float32
    dw_bias: torch.Tensor  # [C]
    dilation: int
    norm_weight: torch.Tensor  # [C]
    norm_bias: torch.Tensor  # [C]
    eps: float
    up: PackedLinear
    down: PackedLinear
    gamma: torch.Tensor  # [C] float32, the layer scale

    @classmethod
    def of(cls, block: ConvNeXtBlock) -> PackedBlock:
        conv = block.dwconv
        return cls(_via_bf16(conv.weight)[:, 0].T.contiguous(), _via_bf16(conv.bias), conv.dilation[0],
                   _f32(block.norm.weight), _f32(block.norm.bias), block.norm.eps,
                   PackedLinear.of(block.pwconv1.weight, block.pwconv1.bias),
                   PackedLinear.of(block.pwconv2.weight, block.pwconv2.bias),
                   _f32(getattr(block, block.layer_scale_name)))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, C] float32, updated in place
        ops: Any = kernels.ops()
        h = ops.dwconv_norm(x, self.dw_weight, self.dw_bias, self.dilation, self.norm_weight, self.norm_bias,
                            self.eps)  # [T, C] bf16
        out: torch.Tensor = ops.scale_add_(x, self.down(self.up(h, gelu=True)), self.gamma)
        return out


@dataclass(frozen=True)
class PackedStack:
    """ConvNeXtStack plus the mel head (out_conv, coef) of its Decoder or DVAE: frames [2T, idim] -> mel."""

    conv_in: tuple[PackedLinear, PackedLinear]
    kernel_in: tuple[int, int]
    blocks: tuple[PackedBlock, ...]
    conv_out: PackedLinear
    out_conv: PackedLinear
    kernel_out: int
    coef: torch.Tensor  # [n_mels] float32

    @classmethod
    def of(cls, stack: ConvNeXtStack, out_conv: nn.Conv1d, coef: torch.Tensor) -> PackedStack:
        conv0, conv1 = stack.conv_in[0], stack.conv_in[2]
        assert isinstance(conv0, nn.Conv1d) and isinstance(conv1, nn.Conv1d)
        return cls((PackedLinear.of_conv(conv0), PackedLinear.of_conv(conv1)),
                   (conv0.kernel_size[0], conv1.kernel_size[0]),
                   tuple(PackedBlock.of(b) for b in stack.decoder_block),  # type: ignore[arg-type]  # ModuleList
                   PackedLinear.of_conv(stack.conv_out), PackedLinear.of_conv(out_conv), out_conv.kernel_size[0],
                   coef.detach().float().reshape(-1))

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:  # [2T, idim] -> mel [2T, n_mels] float32
        (first, second), (k0, k1) = self.conv_in, self.kernel_in
        x = second(windows(first(windows(frames, k0), gelu=True), k1)).float()  # [2T, hidden]
        for block in self.blocks:
            x = block(x)
        y = self.conv_out(x.to(torch.bfloat16))
        return self.out_conv(windows(y, self.kernel_out)).float() * self.coef


@dataclass(frozen=True)
class PackedVocos:
    """Vocos' backbone and head linear, channels-last: mel [F, n_mels] -> the head's output [F, n_fft + 2]."""

    embed: PackedLinear
    kernel: int
    norm: nn.LayerNorm
    blocks: tuple[PackedBlock, ...]
    final_norm: nn.LayerNorm
    head: PackedLinear

    @classmethod
    def of(cls, vocos: Vocos) -> PackedVocos:
        bb = vocos.backbone
        return cls(PackedLinear.of_conv(bb.embed), bb.embed.kernel_size[0], _f32_norm(bb.norm),
                   tuple(PackedBlock.of(b) for b in bb.convnext),  # type: ignore[arg-type]  # ModuleList
                   _f32_norm(bb.final_layer_norm), PackedLinear.of(vocos.head.out.weight, vocos.head.out.bias))

    def __call__(self, mel: torch.Tensor) -> torch.Tensor:  # [F, n_mels] -> [F, n_fft + 2] float32
        x = self.norm(self.embed(windows(mel, self.kernel)).float())  # [F, dim]
        for block in self.blocks:
            x = block(x)
        return self.head(self.final_norm(x).to(torch.bfloat16)).float()


def _f32(t: torch.Tensor | None) -> torch.Tensor:
    assert t is not None
    return t.detach().float().contiguous()


def _via_bf16(t: torch.Tensor | None) -> torch.Tensor:
    """A conv's parameter rounded to bf16 (what autocast multiplies), held as float32: modules whose weights
    cast_for_autocast made bf16 give the same numbers as the float32 originals."""
    return _f32(None if t is None else t.detach().to(torch.bfloat16))


def _f32_norm(norm: nn.LayerNorm) -> nn.LayerNorm:
    out = nn.LayerNorm(norm.normalized_shape, eps=norm.eps)
    out.load_state_dict({k: v.float() for k, v in norm.state_dict().items()})
    return out


_PACKED: weakref.WeakKeyDictionary[nn.Module, PackedStack | PackedVocos] = weakref.WeakKeyDictionary()


def packed_mel(model: Decoder | DVAE) -> PackedStack:
    """model's packed copy, made once (the module's weights are read then; they do not change in inference)."""
    if model not in _PACKED:
        _PACKED[model] = PackedStack.of(model.decoder, model.out_conv, model.coef)
    found = _PACKED[model]
    assert isinstance(found, PackedStack)
    return found


def packed_vocos(vocos: Vocos) -> PackedVocos:
    if vocos not in _PACKED:
        _PACKED[vocos] = PackedVocos.of(vocos)
    found = _PACKED[vocos]
    assert isinstance(found, PackedVocos)
    return found


def mel_frames(model: Decoder | DVAE, row: torch.Tensor) -> torch.Tensor:  # [T, C] -> mel [2T, n_mels] float32
    """A row of GPT hidden states [T, H] (Decoder) or codes [T, 4] (DVAE) -> its mel, channels-last."""
    with torch.inference_mode():
        if isinstance(model, Decoder):
            feats = row.float()  # [T, 2 idim]
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):  # as the module path (its projections may be bf16)
                feats = model.vq_layer.decode(row.T[None])[0].T.float()  # [T, 2 idim]
        with torch.autocast("cpu", enabled=False):
            frames = feats.reshape(2 * feats.shape[0], feats.shape[1] // 2)  # step t -> frames 2t, 2t + 1
            return packed_mel(model)(frames)


def vocos_wav(vocos: Vocos, mel: torch.Tensor) -> torch.Tensor:  # [F, n_mels] -> [(F - 1) * hop] float32
    with torch.inference_mode(), torch.autocast("cpu", enabled=False):
        out = packed_vocos(vocos)(mel)  # [F, n_fft + 2]
        spec = vocos.head.polar(out.T[None])  # [1, n_fft // 2 + 1, F] complex
        wav: torch.Tensor = vocos.head.istft(spec)
        return wav[0]
