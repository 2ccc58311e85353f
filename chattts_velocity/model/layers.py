"""GPT building blocks: RMSNorm, rotary position embedding (NeoX layout) and the SiLU-gated MLP.

Tensors in and out are packed rows `[N, ...]`; the numerics follow HF Llama in fp32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from chattts_velocity.model.packed import PackedLinear

ROW_TILE = 8  # rows of every GEMM of tiled_linear


def tiled_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [N, in] @ weight[out, in].T -> [N, out] as one batch of GEMMs of exactly ROW_TILE rows (zero-padded).

    BLAS and oneDNN choose their kernel, and with it the summation order, from the number of rows (F.linear sums a
    row alone in another order than the same row among others); at one fixed shape each row's output is the same
    whichever rows share its GEMM, so a row's bits do not depend on its batch. Costs up to ~2x F.linear's time.
    """
    rows, pad = x.shape[0], -x.shape[0] % ROW_TILE
    if pad:
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
    tiles = x.view(-1, ROW_TILE, x.shape[1])  # [N / ROW_TILE, ROW_TILE, in]
    out = torch.bmm(tiles, weight.t().expand(tiles.shape[0], -1, -1))  # [N / ROW_TILE, ROW_TILE, out]
    return out.flatten(0, 1)[:rows]


def linear(module: nn.Linear, x: torch.Tensor, tiled: bool) -> torch.Tensor:
    """module(x), through tiled_linear when `tiled` (the checkpoint's bias-free projections)."""
    out: torch.Tensor = tiled_linear(x, module.weight) if tiled else module(x)
    return out


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # statistics in fp32, cast back before the weight multiply (the HF order)
        input_dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * x.to(input_dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for positions 0..max_positions-1, computed once in fp32."""

    cos_cache: torch.Tensor  # buffers, registered in __init__
    sin_cache: torch.Tensor

    def __init__(self, head_dim: int, max_positions: int, base: float) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.base = base
        cos, sin = self._tables(torch.device("cpu"))
        self.register_buffer("cos_cache", cos, persistent=False)  # [max_positions, head_dim] fp32
        self.register_buffer("sin_cache", sin, persistent=False)  # [max_positions, head_dim] fp32

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
        inv_freq = 1.0 / (self.base**exponent)  # [head_dim / 2]
        positions = torch.arange(self.max_positions, device=device).float()
        freqs = positions[:, None] * inv_freq[None, :]  # one fp32 product each, as HF's K=1 matmul
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def reset_tables(self) -> None:
        """Recompute the tables in place (after `to_empty()` left them uninitialised)."""
        cos, sin = self._tables(self.cos_cache.device)
        self.cos_cache = cos.to(self.cos_cache.dtype)
        self.sin_cache = sin.to(self.sin_cache.dtype)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # positions [N]; q, k [N, num_heads, head_dim]
        cos = self.cos_cache[positions].to(q.dtype).unsqueeze(1)  # [N, 1, head_dim]
        sin = self.sin_cache[positions].to(q.dtype).unsqueeze(1)
        q = (q * cos) + (rotate_half(q) * sin)
        k = (k * cos) + (rotate_half(k) * sin)
        return q, k


class LlamaMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.gate_up_packed: PackedLinear | None = None  # fused gate/up rows; set by ChatTTSLlama.pack_linears
        self.down_packed: PackedLinear | None = None
        self.tiled = False  # unpacked projections through tiled_linear; set by ChatTTSLlama.use_batch_invariant_ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor
        if self.gate_up_packed is None or self.down_packed is None:
            gated = F.silu(linear(self.gate_proj, x, self.tiled)) * linear(self.up_proj, x, self.tiled)
            out = linear(self.down_proj, gated, self.tiled)
        else:
            gate, up = self.gate_up_packed(x).chunk(2, dim=-1)  # [N, 2I] -> 2 x [N, I]
            out = self.down_packed(F.silu(gate) * up)
        return out
