"""Model stage: frozen Linear weights in the layouts fast CPU kernels want (bf16 / int8 / int4 tiles or AMX panels).

In: x [N, in_features] activations. Out: [N, out_features] (dtype per mode, see PackedLinear).
The checkpoint's nn.Linear modules stay untouched (their names are the state-dict keys); a model's
`pack_linears()` adds PackedLinear siblings that the forward uses instead.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from chattts_velocity.model import kernels

MODES = ("float32", "bfloat16", "float16", "int8", "int4")


# NOTE: oneDNN's prepacked weight is an opaque MKLDNN tensor. Called directly, torch.compile's
# inductor insists on packing weights itself (and fails on ours); behind this custom op it calls
# the kernel as is, so eager and compiled steps run exactly the same GEMM.
@torch.library.custom_op("chattts_velocity::linear_onednn", mutates_args=())
def linear_onednn(x: Tensor, packed: Tensor, out_features: int) -> Tensor:
    out: Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    return out


@linear_onednn.register_fake
def _linear_onednn_fake(x: Tensor, packed: Tensor, out_features: int) -> Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


def onednn_bf16_available() -> bool:
    available = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]  # unannotated in torch
    return bool(available and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """y = x @ W.T without bias, W frozen. Holds no parameters, so it never enters a state dict.

    On CPUs where our kernels build (kernels.isa(): AVX-512 BF16, AVX2 + FMA, aarch64 NEON), modes "bfloat16",
    "int8" and "int4" keep W in one kernel layout, chosen from the CPU once: AMX panels (kernels/cpu_amx.cpp) on
    AMX CPUs for bf16 / int8, else tiles (kernels/cpu_linear.cpp). Either kernel streams W once per call and is
    batch-invariant: a row's output does not depend on the other rows, so a seeded request decodes the same alone,
    in any batch and after preemption. x and y are bf16 in these modes; "int8" is weight-only int8 (symmetric, per
    output channel), half the bytes of bf16, or on the tiles with CHATTTS_VELOCITY_INT8_ACTIVATIONS=q8 times x
    quantised per row and 32 columns (kernels.int8_q8: integer dot products); "int4" is int4 weights (symmetric,
    one fp32 scale per 32 input columns of a row, fitted by kernels.quantize_int4), 0.625 bytes per weight, times
    activations the kernel quantises per row and 32 columns to int8 (kernels.quantize_q8_rows): integer dot products
    per group, as llama.cpp's Q4_0.
    Elsewhere: bf16 through oneDNN (or a plain bf16 GEMM), int8 through torch's int8-weight kernel with bf16
    activations, int4 dequantised to bf16; "float32" and "float16" through F.linear. These torch paths may depend
    on the batch.
    """

    def __init__(self, weight: Tensor, mode: str) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"PackedLinear: mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.out_features, self.in_features = weight.shape
        weight = weight.detach()
        # Kernel-specific forms are plain attributes: module.to() must not touch them.
        self.weight: Tensor | None = None  # [out, in] when used through F.linear
        self.packed: Tensor | None = None  # our kernels' layout: kernels.to_panels (AMX) or kernels.to_tiles
        self.onednn: Tensor | None = None  # opaque oneDNN bf16 weight
        self.qweight: Tensor | None = None  # int8 [out, in] for torch's int8-weight kernel
        self.scales: Tensor | None = None  # int8: [out] per-channel scales; int4: [out/4, in/32, 4] per group
        self.isa: str | None = None  # the ISA whose library packed W (kernels.isa() then)
        self.int8_q8 = False  # int8 tiles times x's Q8 rows (kernels.int8_q8()), else weight-only
        if mode == "int4":
            q, scales = kernels.quantize_int4(weight.float())
            if _kernels_fit(q, mode):
                self.packed, self.scales = kernels.to_int4_tiles(q, scales)
            else:
                self.weight = (q.float() * scales.repeat_interleave(kernels.INT4_GROUP, dim=1)).to(torch.bfloat16)
        elif mode == "int8":
            qweight, self.scales = _quantize_int8(weight.float())
            self.packed = _kernel_layout(qweight, 16, mode)
            self.int8_q8 = self.packed is not None and not _is_panels(self.packed) and kernels.int8_q8()
            if self.packed is None:
                self.qweight, self.scales = qweight, self.scales.to(torch.bfloat16)
                if self.in_features % 16:  # torch's int8-weight kernel is wrong (or crashes) there
                    self.weight = self.dequantized().to(torch.bfloat16)
        elif mode == "bfloat16" and weight.device.type == "cpu":
            weight = weight.to(torch.bfloat16).contiguous()
            self.packed = _kernel_layout(weight, 32, mode)
            if self.packed is None and onednn_bf16_available():
                self.onednn = torch.ops.mkldnn._reorder_linear_weight(weight)
            elif self.packed is None:
                self.weight = weight
        else:
            self.weight = weight.to(getattr(torch, mode)).contiguous()
        if self.packed is not None:
            self.isa = kernels.isa()

    @property
    def ops(self) -> Any:  # torch.ops.<library>: its ops are looked up by name at run time
        """The torch.ops namespace of the library that packed W (a property: the module stays deep-copyable)."""
        return getattr(torch.ops, f"chattts_velocity_{self.isa}") if self.isa else None

    @property
    def kernel(self) -> str:
        """Which kernel runs: "amx", "tiles", "onednn", "int8mm" or "torch" (kernels.kernel_path() names the ISA)."""
        if self.packed is not None:
            return "amx" if _is_panels(self.packed) else "tiles"
        if self.weight is not None:
            return "torch"
        return "onednn" if self.onednn is not None else "int8mm"

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}, "
                f"kernel={self.kernel}")

    def forward(self, x: Tensor) -> Tensor:  # x [N, in] -> [N, out]
        if self.weight is not None:
            return F.linear(x.to(self.weight.dtype), self.weight)
        x = x.to(torch.bfloat16)  # in a compiled step this cast fuses into the op that produced x
        out: Tensor
        if self.packed is not None:
            if self.mode == "int8":
                linear = self.ops.linear_int8_q8 if self.int8_q8 else self.ops.linear_int8
                out = linear(x, self.packed, self.scales)
            elif self.mode == "int4":
                out = self.ops.linear_int4(x, self.packed, self.scales)
            else:
                out = self.ops.linear_bf16(x, self.packed)
            return out
        if self.mode == "int8":
            assert self.qweight is not None and self.scales is not None  # int8 without our kernels sets both
            out = torch._weight_int8pack_mm(x, self.qweight, self.scales)
            return out
        assert self.onednn is not None  # bf16 without our kernels and without a plain weight
        if torch.compiler.is_compiling():
            out = linear_onednn(x, self.onednn, self.out_features)
            return out
        out = torch.ops.mkldnn._linear_pointwise(x, self.onednn, None, "none", [], "")  # the custom op costs ~0.1 ms
        return out

    def dequantized(self) -> Tensor:
        """int8 / int4 mode: the weight the kernels multiply with, [out, in] float32."""
        if self.mode not in ("int8", "int4"):
            raise ValueError(f"dequantized: only for int8 and int4 modes, this is {self.mode}")
        if self.mode == "int4" and self.packed is None:
            assert self.weight is not None  # int4 without our kernels keeps the dequantised weight
            return self.weight.float()
        assert self.scales is not None  # set in both modes unless int4 fell back above
        if self.mode == "int4":
            assert self.packed is not None
            q, scales = kernels.from_int4_tiles(self.packed, self.scales)
            return q.float() * scales.repeat_interleave(kernels.INT4_GROUP, dim=1)
        if self.packed is None:
            assert self.qweight is not None
            qweight = self.qweight
        elif _is_panels(self.packed):
            qweight = kernels.from_panels(self.packed)
        else:
            qweight = kernels.from_tiles(self.packed)
        return qweight.float() * self.scales.float()[:, None]


def _kernel_layout(weight: Tensor, chunk: int, mode: str) -> Tensor | None:
    """weight [out, in] (bf16 or int8, on CPU) in our kernels' layout for this CPU, or None where they cannot run."""
    if not _kernels_fit(weight, mode):
        return None
    if kernels.fits_panels(weight) and kernels.amx_ready():
        return kernels.to_panels(weight)
    return kernels.to_tiles(weight, chunk)


def _kernels_fit(weight: Tensor, mode: str) -> bool:
    """Our kernels run here and take this shape ([out, in] with out % 4 == in % 32 == 0, on CPU); a precision that
    falls back to torch because the kernels cannot run here says so once."""
    if weight.device.type != "cpu" or not kernels.fits_tiles(weight, 32):
        return False
    if not kernels.load():
        kernels.warn_slow_path(mode)
        return False
    return True


def _is_panels(packed: Tensor) -> bool:
    return packed.shape[2:] == (16, 2)


def _quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight [out, in] fp32 -> int8 [out, in] and float32 scales [out] with weight ~= int8 * scale."""
    scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)  # [out]
    qweight = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    return qweight, scales


def fuse_rows(*linears: nn.Linear) -> Tensor:
    """The weights of several Linears over the same input stacked as one [sum(out), in] weight."""
    return torch.cat([linear.weight.detach() for linear in linears], dim=0)
