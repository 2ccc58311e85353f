"""Embed (asset/Embed.safetensors): ids -> input embeddings, hidden states -> text/code logits.

Shared by both GPT paths. Text rows use emb_text; audio rows sum the num_vq emb_code tables; the heads are
bias-free weight-normed Linears whose effective weights are computed once and cached.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from chattts_velocity.assets import check_state_dict
from chattts_velocity.model import kernels


def _weight_normed_linear(hidden_size: int, num_out: int) -> nn.Linear:
    linear: nn.Linear = weight_norm(nn.Linear(hidden_size, num_out, bias=False), name="weight", dim=0)
    return linear


def _effective_weight(linear: nn.Module) -> torch.Tensor:
    # W = v * (g / ||v||_row): torch._weight_norm is the exact op the parametrization runs
    g = linear.get_parameter("parametrizations.weight.original0")  # [num_out, 1]
    v = linear.get_parameter("parametrizations.weight.original1")  # [num_out, hidden]
    return torch._weight_norm(v, g, 0)  # [num_out, hidden]


BLAS_MIN_ROWS = 16  # logits_rowwise's BLAS GEMM: fewer rows are padded to this many


def _cpu_heads(hidden: torch.Tensor) -> Any:
    """The loaded C++ CPU kernels (their head_linear) where they take these hidden states, else None."""
    ops = kernels.active_ops
    if ops is None or not hidden.is_cpu or hidden.dtype != torch.float32 or hidden.shape[1] % 16:
        return None
    return ops


class Embed(nn.Module):
    def __init__(self, hidden_size: int, num_audio_tokens: int, num_text_tokens: int, num_vq: int = 4) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.num_audio_tokens = num_audio_tokens
        self.num_text_tokens = num_text_tokens
        self.num_vq = num_vq
        # ModuleLists (keys emb_code.q.*, head_code.q.*), typed by what they hold
        self.emb_code = cast(Sequence[nn.Embedding],
                             nn.ModuleList(nn.Embedding(num_audio_tokens, hidden_size) for _ in range(num_vq)))
        self.emb_text = nn.Embedding(num_text_tokens, hidden_size)
        self.head_text = _weight_normed_linear(hidden_size, num_text_tokens)
        self.head_code = cast(Sequence[nn.Linear], nn.ModuleList(_weight_normed_linear(hidden_size, num_audio_tokens)
                                                                 for _ in range(num_vq)))
        # x [M, H] @ weight [N, H].T -> [M, N] float32 with a row's bits independent of M, for logits_rowwise where
        # BLAS is not row-invariant (cuBLAS picks kernels by M): set by the decode backend; None: BLAS
        self.head_gemm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        # (head, dtype, device) -> (storage stamp of g/v, effective weight); see _head_weight
        self._weight_cache: dict[tuple[object, ...], tuple[tuple[int, ...], torch.Tensor]] = {}
        # "text"/"code" -> the heads' ParametrizationLists (registered at run time: torch types them as Tensor | Module)
        self._param_lists: dict[str, list[Any]] = {}
        self.register_load_state_dict_post_hook(  # type: ignore[no-untyped-call]  # unannotated in torch
            lambda module, keys: module.refresh_weights())

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, torch.Tensor]) -> Embed:
        """Build with sizes read from the tensor shapes and load strictly (ValueError on any key mismatch)."""
        for key in ("emb_text.weight", "emb_code.0.weight"):
            if key not in state_dict:
                raise ValueError(f"Embed state dict: missing {key!r}; is this asset/Embed.safetensors?")
        num_text_tokens, hidden_size = state_dict["emb_text.weight"].shape
        num_audio_tokens = state_dict["emb_code.0.weight"].shape[0]
        num_vq = sum(1 for k in state_dict if k.startswith("emb_code.") and k.endswith(".weight"))
        with torch.device("meta"):
            embed = cls(hidden_size, num_audio_tokens, num_text_tokens, num_vq)
        expected = embed.state_dict()
        check_state_dict("Embed state dict", state_dict, expected, "; is this asset/Embed.safetensors?")
        embed.load_state_dict(state_dict, strict=True, assign=True)
        return embed

    def refresh_weights(self) -> None:
        """Drop the cached head weights (call after editing g/v in place)."""
        self._weight_cache.clear()
        self._param_lists.clear()

    # ---- inputs -----------------------------------------------------------------------------

    @torch.no_grad()
    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        # ids [N] -> [N, H]
        embeds: torch.Tensor = self.emb_text(ids.to(self.emb_text.weight.device))
        return embeds

    @torch.no_grad()
    def embed_codes(self, ids: torch.Tensor) -> torch.Tensor:
        # ids [N, num_vq] -> [N, H]. The reference stacks the lookups on a new last axis and sums it; on CPU that sum
        # adds ((e0 + e1) + e2) + e3 in fp32 (bf16/fp16 tables: in fp32, rounded once). So do, over the concatenated
        # tables, embedding_bag's sum (fp32 tables; it reads each row once) and a sum over dim 1 of one lookup
        # [N, num_vq, H] (others): the same bits (tests/model/test_model_embed.py), ~5-40x faster than the stack
        table = self.code_table()
        ids = ids.to(table.device) + torch.arange(self.num_vq, device=table.device) * self.num_audio_tokens
        if table.dtype == torch.float32:
            return F.embedding_bag(ids, table, mode="sum")
        return F.embedding(ids, table).sum(1, dtype=torch.float32).to(table.dtype)

    def code_table(self) -> torch.Tensor:
        """The num_vq code tables as one [num_vq * num_audio_tokens, H] tensor (a cached copy, rebuilt when a
        table is replaced or moved)."""
        weights = [emb.weight for emb in self.emb_code]
        stamp = tuple(w.data_ptr() for w in weights)
        hit = self._weight_cache.get(("code_table",))
        if hit is None or hit[0] != stamp:
            hit = (stamp, torch.cat([w.detach() for w in weights]))
            self._weight_cache[("code_table",)] = hit
        return hit[1]

    @torch.no_grad()
    def embed(self, input_ids: torch.Tensor, text_mask: torch.Tensor) -> torch.Tensor:
        """input_ids [N, num_vq] (or [B, L, num_vq]) int64, text_mask [N] (or [B, L]) bool -> [N, H] (or [B, L, H])."""
        if input_ids.dim() == 3:
            flat = self.embed(input_ids.flatten(0, 1), text_mask.flatten())
            return flat.view(*input_ids.shape[:2], self.hidden_size)
        if input_ids.dim() != 2 or input_ids.shape[1] != self.num_vq or text_mask.shape != input_ids.shape[:1]:
            raise ValueError(
                f"Embed.embed: need input_ids [N, {self.num_vq}] and text_mask [N], got "
                f"{tuple(input_ids.shape)} and {tuple(text_mask.shape)}"
            )
        weight = self.emb_text.weight
        input_ids = input_ids.to(weight.device)
        text_mask = text_mask.to(device=weight.device, dtype=torch.bool)
        # NOTE: no boolean indexing (a host sync on CUDA): every row is looked up in both tables, each with ids
        # valid there (0 for the rows of the other kind), and torch.where keeps the row's own kind
        text = self.embed_text(input_ids[:, 0].masked_fill(~text_mask, 0))
        codes = self.embed_codes(input_ids.masked_fill(text_mask.unsqueeze(1), 0))
        return torch.where(text_mask.unsqueeze(1), text, codes).to(weight.dtype)

    @torch.no_grad()
    def apply_speaker(
        self, emb: torch.Tensor, positions: Sequence[int] | torch.Tensor, spk_emb: torch.Tensor
    ) -> torch.Tensor:
        """Replace rows `positions` of emb [N, H] by spk_emb [H] (in place; emb is returned)."""
        if spk_emb.shape != (emb.shape[-1],):
            raise ValueError(f"spk_emb: expected shape [{emb.shape[-1]}], got {tuple(spk_emb.shape)}")
        index = torch.as_tensor(positions, dtype=torch.int64, device=emb.device)
        emb[index] = spk_emb.to(dtype=emb.dtype, device=emb.device)
        return emb

    # ---- heads ------------------------------------------------------------------------------

    def _head_weight(self, name: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        # name "code"/"text" -> [out, H]; "code_t"/"text_t" -> the same transposed, [H, out] contiguous.
        # The stamp (storage addresses of g and v) notices .to()/assignments; load_state_dict clears the cache.
        if name.endswith("_t"):
            plain = name.removesuffix("_t")
            return self._cached(name, dtype, device, lambda: self._head_weight(plain, dtype, device).t().contiguous())
        heads = [self.head_text] if name == "text" else list(self.head_code)
        return self._cached(name, dtype, device, lambda: torch.cat([_effective_weight(h) for h in heads], dim=0))

    def _cached(self, name: str, dtype: torch.dtype, device: torch.device,
                make: Callable[[], torch.Tensor]) -> torch.Tensor:
        stamp = self._head_stamp("text" if name.startswith("text") else "code")
        hit = self._weight_cache.get((name, dtype, device))
        if hit is not None and hit[0] == stamp:
            return hit[1]
        with torch.no_grad():
            weight = make().to(dtype=dtype, device=device)
        self._weight_cache[(name, dtype, device)] = (stamp, weight)
        return weight

    def _head_stamp(self, family: str) -> tuple[int, ...]:
        """The storage addresses of the heads' g and v (a step's hot path: a few attribute reads per head)."""
        lists = self._param_lists.get(family)
        if lists is None:
            heads = [self.head_text] if family == "text" else list(self.head_code)
            lists = self._param_lists[family] = [cast(Any, h).parametrizations.weight for h in heads]
        return tuple(p.data_ptr() for pl in lists for p in (pl.original0, pl.original1))

    @torch.no_grad()
    def code_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden [N, H] -> [N, num_vq, num_audio_tokens] float32 (computed in hidden's dtype)
        weight = self._head_weight("code", hidden.dtype, hidden.device)  # [num_vq * V_audio, H]
        # one GEMM per codebook, as the reference does: bit-identical to head_code[q](hidden) at any N
        logits = [F.linear(hidden, w) for w in torch.split(weight, self.num_audio_tokens)]
        return torch.stack(logits, dim=1).float()

    @torch.no_grad()
    def logits_rowwise(self, hidden: torch.Tensor, name: str) -> torch.Tensor:
        """The engine's heads: as code_logits ("code", [N, num_vq, V_audio]) or text_logits ("text", [N, V_text]), but
        a row's logits do not depend on the other rows (the seed contract): head_gemm where the backend set one; on
        CPU the C++ kernels' head_linear where they are loaded (float32, one fixed summation order per output);
        else one BLAS GEMM against the transposed weight over at least BLAS_MIN_ROWS rows (MKL's kernels for 1-3,
        5-7 and 9-11 rows sum in other orders than for 4, 8 or 12 and more: padding costs nothing at these sizes,
        where the weight's bytes take the time).
        They may differ from code_logits/text_logits in the last bits.
        """
        rows = hidden.shape[0]
        if self.head_gemm is not None:
            logits = self.head_gemm(hidden, self._head_weight(name, hidden.dtype, hidden.device))
        elif (ops := _cpu_heads(hidden)) is not None:
            logits = ops.head_linear(hidden, self._head_weight(name, hidden.dtype, hidden.device))
        else:
            padded = hidden if rows >= BLAS_MIN_ROWS or rows == 0 else torch.cat(
                [hidden, hidden[:1].expand(BLAS_MIN_ROWS - rows, -1)])
            logits = (padded @ self._head_weight(f"{name}_t", hidden.dtype, hidden.device))[:rows].float()
        return logits.view(rows, self.num_vq, self.num_audio_tokens) if name == "code" else logits

    @torch.no_grad()
    def text_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden [N, H] -> [N, num_text_tokens] float32 (computed in hidden's dtype)
        return F.linear(hidden, self._head_weight("text", hidden.dtype, hidden.device)).float()
