"""Model stage: frozen Linear weights in the layout fast CPU kernels want (bf16 oneDNN, int8 dynamic).

In: x [N, in_features] in the model's activation dtype. Out: [N, out_features] in the same dtype.
The checkpoint's nn.Linear modules stay untouched (their names are the state-dict keys); a model's
`pack_linears()` adds PackedLinear siblings that the forward uses instead.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MODES = ("float32", "bfloat16", "float16", "int8")


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

    mode "bfloat16": W in bf16, reordered once for oneDNN (falls back to a plain bf16 GEMM where
    oneDNN has no bf16 kernels). "int8": weight-only int8, W quantised symmetrically per output
    channel and multiplied with bf16 activations by torch's int8-weight kernel (half the bytes
    of bf16: a win at batch 1-4, a loss beyond). "float32" and "float16": W through F.linear.
    """

    def __init__(self, weight: Tensor, mode: str) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"PackedLinear: mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.out_features, self.in_features = weight.shape
        weight = weight.detach()
        self.weight: Tensor | None = None  # [out, in] when used through F.linear
        self.packed = None  # opaque kernel-specific form; plain attribute: module.to() must not touch it
        if mode == "bfloat16" and weight.device.type == "cpu" and onednn_bf16_available():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.to(torch.bfloat16).contiguous())
        elif mode == "int8":
            self.packed, self.scales = _quantize_int8(weight.float())
        else:
            self.weight = weight.to(getattr(torch, mode)).contiguous()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}"

    def forward(self, x: Tensor) -> Tensor:
        if self.weight is not None:
            return F.linear(x.to(self.weight.dtype), self.weight)
        x = x.to(torch.bfloat16)
        if self.mode == "int8":
            return torch._weight_int8pack_mm(x, self.packed, self.scales)
        if torch.compiler.is_compiling():
            return linear_onednn(x, self.packed, self.out_features)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")  # the custom op costs ~0.1 ms


def _quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight [out, in] fp32 -> int8 [out, in] and bf16 scales [out] with weight ~= int8 * scale."""
    scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)  # [out]
    qweight = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    return qweight, scales.to(torch.bfloat16)


def fuse_rows(*linears: nn.Linear) -> Tensor:
    """The weights of several Linears over the same input stacked as one [sum(out), in] weight."""
    return torch.cat([linear.weight.detach() for linear in linears], dim=0)
