"""Model stage: frozen Linear weights in the layouts fast CPU kernels want (bf16 tiles + oneDNN, int8 tiles).

In: x [N, in_features] activations. Out: [N, out_features] (dtype per mode, see PackedLinear).
The checkpoint's nn.Linear modules stay untouched (their names are the state-dict keys); a model's
`pack_linears()` adds PackedLinear siblings that the forward uses instead.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from chattts_velocity.model import kernels

MODES = ("float32", "bfloat16", "float16", "int8")
TILES_BELOW_ROWS = 5  # bf16 batches of fewer rows use the tile kernel, larger ones AMX or oneDNN (crossover 4-6)


# NOTE: oneDNN's prepacked weight is an opaque MKLDNN tensor. Called directly, torch.compile's
# inductor insists on packing weights itself (and fails on ours); behind this custom op it calls
# the kernel as is, so eager and compiled steps run exactly the same GEMM.
@torch.library.custom_op("chattts_velocity::linear_onednn", mutates_args=())
def linear_onednn(x: Tensor, packed: Tensor, out_features: int) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


@linear_onednn.register_fake
def _linear_onednn_fake(x: Tensor, packed: Tensor, out_features: int) -> Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


def onednn_bf16_available() -> bool:
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PackedLinear(nn.Module):
    """y = x @ W.T without bias, W frozen. Holds no parameters, so it never enters a state dict.

    mode "bfloat16": W in bf16. On CPUs with AVX-512 BF16 batches of fewer than TILES_BELOW_ROWS rows stream W
    through our tile kernel (kernels/cpu_linear.cpp, ~1.5x oneDNN's speed at one row); with AMX, batches up to
    64 rows go through kernels/cpu_amx.cpp (W read once for all rows, 1.2-1.8x oneDNN), and larger ones use
    oneDNN's prepacked GEMM. W is kept in each layout it uses. Elsewhere oneDNN, or a plain bf16 GEMM without it.
    "int8": weight-only int8, W quantised symmetrically per output channel; the tile kernel multiplies it with
    fp32 activations (half the bytes of bf16: the fastest mode), from TILES_BELOW_ROWS rows on the AMX kernel
    (bf16 activations) where present, or torch's int8-weight kernel with bf16 activations where ours are
    unavailable. "float32" and "float16": W through F.linear. Outputs: bf16 in mode "bfloat16", float32 from
    our int8 kernels.
    """

    def __init__(self, weight: Tensor, mode: str) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"PackedLinear: mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.out_features, self.in_features = weight.shape
        weight = weight.detach()
        on_cpu = weight.device.type == "cpu"
        # Kernel-specific forms are plain attributes: module.to() must not touch them.
        self.weight: Tensor | None = None  # [out, in] when used through F.linear
        self.onednn = None  # opaque oneDNN bf16 weight
        self.tiles: Tensor | None = None  # kernels.to_tiles layout for cpu_linear.cpp
        self.panels: Tensor | None = None  # kernels.to_panels layout for cpu_amx.cpp
        self.qweight: Tensor | None = None  # int8 [out, in] for torch's int8-weight kernel
        self.scales: Tensor | None = None  # int8: [out] per-channel scales
        if mode == "int8":
            qweight, self.scales = _quantize_int8(weight.float())
            if on_cpu and kernels.fits_tiles(qweight, 16) and kernels.load():
                self.tiles = kernels.to_tiles(qweight, 16)
                if kernels.fits_panels(qweight) and kernels.amx_ready():
                    self.panels = kernels.to_panels(qweight)
            else:
                self.qweight, self.scales = qweight, self.scales.to(torch.bfloat16)
                if self.in_features % 16:  # torch's int8-weight kernel is wrong (or crashes) there
                    self.weight = self.dequantized().to(torch.bfloat16)
        elif mode == "bfloat16" and on_cpu:
            weight = weight.to(torch.bfloat16).contiguous()
            if onednn_bf16_available():
                self.onednn = torch.ops.mkldnn._reorder_linear_weight(weight)
            if kernels.fits_tiles(weight, 32) and kernels.load():
                self.tiles = kernels.to_tiles(weight, 32)
                if kernels.fits_panels(weight) and kernels.amx_ready():
                    self.panels = kernels.to_panels(weight)
            if self.onednn is None and self.tiles is None:
                self.weight = weight
        else:
            self.weight = weight.to(getattr(torch, mode)).contiguous()

    def extra_repr(self) -> str:
        kernel = "tiles+amx" if self.panels is not None else "tiles" if self.tiles is not None else (
            "onednn" if self.onednn is not None else "torch")
        return f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}, kernel={kernel}"

    def forward(self, x: Tensor) -> Tensor:  # x [N, in] -> [N, out]
        if self.weight is not None:
            return F.linear(x.to(self.weight.dtype), self.weight)
        if self.tiles is not None:
            if self.mode == "int8":
                return torch.ops.chattts_velocity_cpu.linear_int8(x.float(), self.tiles, self.panels, self.scales,
                                                                  TILES_BELOW_ROWS)
            x = x.to(torch.bfloat16)  # in a compiled step this cast fuses into the op that produced x
            return torch.ops.chattts_velocity_cpu.linear_bf16(x, self.tiles, self.panels, self.onednn, TILES_BELOW_ROWS)
        x = x.to(torch.bfloat16)
        if self.mode == "int8":
            return torch._weight_int8pack_mm(x, self.qweight, self.scales)
        if torch.compiler.is_compiling():
            return linear_onednn(x, self.onednn, self.out_features)
        return torch.ops.mkldnn._linear_pointwise(x, self.onednn, None, "none", [], "")  # the custom op costs ~0.1 ms

    def dequantized(self) -> Tensor:
        """int8 mode: the weight the kernels multiply with, [out, in] float32."""
        if self.mode != "int8":
            raise ValueError(f"dequantized: only for int8 mode, this is {self.mode}")
        if self.tiles is not None:
            qweight = self.tiles.transpose(1, 2).reshape(self.out_features, self.in_features)
        else:
            qweight = self.qweight
        return qweight.float() * self.scales.float()[:, None]


def _quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight [out, in] fp32 -> int8 [out, in] and float32 scales [out] with weight ~= int8 * scale."""
    scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)  # [out]
    qweight = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    return qweight, scales


def fuse_rows(*linears: nn.Linear) -> Tensor:
    """The weights of several Linears over the same input stacked as one [sum(out), in] weight."""
    return torch.cat([linear.weight.detach() for linear in linears], dim=0)
