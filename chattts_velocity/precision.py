"""Precision: every dtype of a loaded model, decided once from the user's choices.

In: dtype ("auto" or a precision name), kv_cache_dtype, decode_dtype, device (None: CUDA when there is one, else
the CPU), decode backend, whether our C++ CPU kernels run here (model.kernels.unsupported() is None) and whether the
CPU computes bf16 natively (model.kernels.native_bf16()); both passed in: this module imports nothing of the package
(engine/loading/host.py reads them: `decide_here`).
Out: `Precision`, the device with every dtype, read by the engine (weights, packing, KV cache, activations), the
plain path (its device; float32 only) and the audio stage (decode dtype); nothing else derives a dtype or a device
from these strings.

| dtype | GPT weights | linears | KV cache ("auto") | activations |
|---|---|---|---|---|
| float32 | float32 | the model's own (exact: the plain path's numbers) | float32 | float32 |
| bfloat16, float16 | bfloat16, float16 | prepacked on CPU; the model's own on CUDA | the weights' | float32 on CPU |
| int8, int4 | bfloat16 | weight-only int8; int4 (scale per 32 columns) x int8 activations | bfloat16 | float32 on CPU |

Off CPU the activations are the weights' dtype. kv_cache_dtype "int8" (one fp32 scale per slot and head) runs on
the cpu backend with the bf16 / int8 / int4 precisions only. The heads and the sampler always run in float32. The
audio decode (Decoder + Vocos) runs bfloat16 under autocast on CUDA, or with a bf16 / int8 / int4 GPT on a CPU where
our C++ kernels run: bf16 arithmetic where the CPU computes bf16 natively (AVX-512 BF16, AMX), elsewhere (AVX2, NEON)
bf16 weights in fp32 arithmetic (audio/cpu_panels.py: waveform SNR ~35 dB against float32, ~1.2-1.35x its speed;
autocast's emulated bf16 would be 1.7x slower than float32: benchmarks/bench_audio_dtype.py); exact float32
otherwise, unless decode_dtype says.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = ("float32", "bfloat16", "float16", "int8", "int4")
DTYPE_CHOICES = ("auto", *DTYPES)  # what a user may ask for ("auto": fastest_dtype on the device)
KV_CACHE_DTYPES = ("auto", "int8")
DECODE_DTYPES = ("bfloat16", "float32")
# dtype -> (dtype the GPT checkpoint is loaded in, PackedLinear mode or None for the model's own linears)
WEIGHTS: dict[str, tuple[torch.dtype, str | None]] = {
    "float32": (torch.float32, None),
    "bfloat16": (torch.bfloat16, "bfloat16"),
    "float16": (torch.float16, "float16"),
    "int8": (torch.bfloat16, "int8"),
    "int4": (torch.bfloat16, "int4"),
}
REDUCED = ("bfloat16", "int8", "int4")  # the cpu backend's precisions: int8 KV pools, bf16 audio decode by default
# where the CPU computes bf16 natively


@dataclass(frozen=True)
class Precision:
    """The device and the dtypes of one loaded model. Build with `Precision.decide`."""

    device: torch.device  # where every stage runs
    dtype: str  # one of DTYPES ("auto" resolved)
    weights: torch.dtype  # the GPT checkpoint's parameters as loaded
    packing: str | None  # PackedLinear mode of the GPT's linears; None: the model's own
    kv_cache: torch.dtype  # the KV pools (torch.int8: one fp32 scale per slot and head)
    activations: torch.dtype  # between the layers
    audio: torch.dtype | None  # Decoder + Vocos autocast dtype; None: exact float32

    @classmethod
    def decide(cls, dtype: str = "float32", kv_cache_dtype: str = "auto", decode_dtype: str | None = None,
               device: str | torch.device | None = "cpu", backend: str = "auto", cpu_kernels: bool | None = None,
               cpu_bf16: bool = False) -> Precision:
        """The precision of these choices; a ValueError naming the field for a choice that cannot be.

        cpu_kernels (whether our C++ CPU kernels run here) is read by dtype "auto", which needs it, and with cpu_bf16
        (whether this CPU computes bf16 natively) by the audio decode's default on CPU (bf16 where either holds)."""
        where = resolve_device(device)
        on = where.type
        if dtype == "auto" and cpu_kernels is None:
            raise ValueError("dtype: 'auto' is resolved where the kernels are known: Precision.decide(dtype='auto', "
                             "cpu_kernels=...) or the CLI's --dtype auto; the engine takes a precision name")
        name = fastest_dtype(on, bool(cpu_kernels)) if dtype == "auto" else dtype
        if name not in DTYPES:
            raise ValueError(f"dtype: must be auto, {', '.join(DTYPES[:-1])} or {DTYPES[-1]}, got {dtype!r}")
        weights, packing = WEIGHTS[name]
        if on == "cuda" and packing in ("bfloat16", "float16"):
            packing = None  # cuBLAS on the loaded weights: packing would add a fused copy of q/k/v and gate/up
        return cls(
            device=where, dtype=name, weights=weights, packing=packing,
            kv_cache=_kv_cache(kv_cache_dtype, name, weights, str(where), backend),
            activations=torch.float32 if on == "cpu" else weights,
            audio=_audio(decode_dtype, name, on, bool(cpu_bf16 or cpu_kernels)),
        )

    @property
    def exact(self) -> bool:
        """True for float32 everywhere in the GPT stage (the plain path's numbers)."""
        return self.dtype == "float32"

    def describe(self) -> str:
        """One line for the load log: what each stage runs in."""
        linears = f", packed {self.packing} linears" if self.packing else ""
        audio = _name(self.audio or torch.float32)
        return (f"precision {self.dtype} on {self.device}: weights {_name(self.weights)}{linears}, "
                f"KV cache {_name(self.kv_cache)}, "
                f"activations {_name(self.activations)}, audio decode {audio}")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device a model loads on: the one asked for, else CUDA when there is one, else the CPU. Decided once,
    with the precision (Precision.decide), and passed down inside it."""
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def fastest_dtype(device_type: str, cpu_kernels: bool) -> str:
    """The fastest precision whose quality docs/performance.md accepts (>= 95 % teacher-forced code agreement with
    float32) on this device type:

    - bfloat16 on CUDA.
    - int8 where our CPU kernels run (kernels.isa(): x86 with AVX2 + FMA, AVX-512 or AMX; aarch64): half of
      bf16's weight bytes per step, faster at every batch size measured, 96 % agreement, the seed contract holds.
      int4 reads fewer bytes (faster linears at one row) but its agreement is below the bar.
    - float32 elsewhere: torch's bf16 / int8 kernels are only ~1.2-1.5x faster there and their numbers depend on
      the batch (no seed contract), so exact float32 stays the default.
    """
    if device_type == "cuda":
        return "bfloat16"
    return "int8" if device_type == "cpu" and cpu_kernels else "float32"


def _kv_cache(choice: str, dtype: str, weights: torch.dtype, device: str, backend: str) -> torch.dtype:
    if choice not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype: must be one of {', '.join(KV_CACHE_DTYPES)}, got {choice!r}")
    if choice == "auto":
        return weights
    if not (torch.device(device).type == "cpu" and backend in ("auto", "cpu") and dtype in REDUCED):
        raise ValueError("kv_cache_dtype: 'int8' runs only on the cpu backend (device 'cpu', backend 'auto' or "
                         f"'cpu', dtype 'bfloat16', 'int8' or 'int4'), got device={device!r}, "
                         f"backend={backend!r}, dtype={dtype!r}")
    return torch.int8


def _audio(choice: str | None, dtype: str, device_type: str, cpu_path: bool) -> torch.dtype | None:
    if choice is None:  # cpu_path: a C++ bf16 audio path runs on this CPU (audio/cpu_decode.path())
        native = device_type == "cuda" or (device_type == "cpu" and cpu_path and dtype in REDUCED)
        choice = "bfloat16" if native else "float32"
    if choice not in DECODE_DTYPES:
        raise ValueError(f"decode_dtype: must be 'bfloat16', 'float32' or None, got {choice!r}")
    return torch.bfloat16 if choice == "bfloat16" else None


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
