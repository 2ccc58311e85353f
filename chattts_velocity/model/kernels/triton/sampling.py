"""Engine stage ops for the CUDA backend, on the logits' device: nothing goes to the host but the sampled ids.

Rows are (sequence, codebook) pairs, logits [R, V] fp32, per-row parameters [R], as in
engine/worker/sampling/logits_processors.py, whose semantics these ops keep (HF top-p / top-k with 3 tokens kept, the
reference's asymmetric penalty).
The caller applies them in engine's sampling/sampler.py order: temperature + penalty (one kernel, which also makes
the fp32 copy), top-p + top-k (top_p_top_k.py: no sort), custom processors, then `sample`: EOS mask, softmax, noise
and argmax in one kernel (`mask_eos` alone where the chain's output is wanted). Without custom processors `sample`
also runs top-p + top-k (top_p / top_k given): the whole chain is two kernels. The draw's softmax is the kernel's
own, so a row's token can differ from torch's softmax / noise / argmax only where two scores tie to the last bit, or
where torch would pick a dropped column (probability 0 over noise 0 is NaN, which torch's argmax takes for the
maximum; the kernel never).

NOTE (noise): `sample` draws its Exp(1) noise with Philox in Triton, keyed by the request's step seed
(engine's sampling/sampler.step_seed) and the element's index inside the request's [rows, V] block. Like the CPU path it
depends only on (seed, step), never on the batch, so batch invariance holds; but it is a different stream
from the CPU path's torch.Generator (same distribution), so a seed gives different audio on CUDA than on CPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from chattts_velocity.model.kernels.triton.top_p_top_k import (
    COLUMN_BITS,
    EAGER,
    MIN_KEEP,
    apply_top_p_top_k,
    search_for,
    top_p_top_k_cut,
)

__all__ = ["MIN_KEEP", "apply_temperature_and_penalty", "apply_top_p_top_k", "exponential_noise", "mask_eos",
           "noise_seeds", "sample"]
NOISE_BLOCK = 1024  # vocabulary entries per noise program
HISTORY_TILE = 16  # history ids per tile of the penalty (the default penalty window)
FLOAT32_MAX = tl.constexpr(3.4028234663852886e38)  # torch.finfo(torch.float32).max


@triton.jit(do_not_specialize=["history_stride", "width"])
def _temperature_penalty_kernel(in_ptr, logits_ptr, temperatures_ptr, history_ptr, penalties_ptr, in_stride,
                                logits_stride, history_stride, vocab, width, BLOCK_V: tl.constexpr,
                                BLOCK_W: tl.constexpr):
    # one program per row: the input row (any float dtype) in fp32 divided by its temperature into the output row
    # (in_ptr may be logits_ptr), then penalise the ids of its history window, visited in tiles of BLOCK_W (one
    # compiled variant for every window width)
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * logits_stride
    temperature = tl.load(temperatures_ptr + row)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = tl.load(in_ptr + row * in_stride + cols, mask=cols < vocab).to(tl.float32)
        tl.store(row_ptr + cols, tl.div_rn(x, temperature), mask=cols < vocab)
    tl.debug_barrier()  # the penalty reads what the temperature pass wrote
    penalty = tl.load(penalties_ptr + row)
    history = history_ptr + row * history_stride
    for first_i in range(0, width, BLOCK_W):
        i = first_i + tl.arange(0, BLOCK_W)
        ids = tl.load(history + i, mask=i < width, other=-1)  # -1 = padding
        valid = ids >= 0
        count = tl.zeros([BLOCK_W], dtype=tl.int32)
        earlier = tl.zeros([BLOCK_W], dtype=tl.int32)
        for first_j in range(0, width, BLOCK_W):
            j = first_j + tl.arange(0, BLOCK_W)
            other = tl.load(history + j, mask=j < width, other=-1)
            same = (ids[:, None] == other[None, :]) & (other >= 0)[None, :]  # [W, W]
            count += tl.sum(same.to(tl.int32), 1)
            earlier += tl.sum((same & (j[None, :] < i[:, None])).to(tl.int32), 1)
        # each id is read and written by its first occurrence only, so no two threads touch one logit
        first = earlier == 0
        alpha = tl.full([BLOCK_W], 1.0, tl.float32)
        for n in range(0, width):  # alpha = penalty ** count, count <= width
            alpha = tl.where(n < count, alpha * penalty, alpha)
        ptrs = row_ptr + tl.where(valid, ids, 0)
        scores = tl.load(ptrs, mask=valid & first, other=0.0)
        penalised = tl.where(scores < 0, scores * alpha, tl.div_rn(scores, alpha))
        # a tiny penalty's alpha underflows to 0: s/0 is inf, 0/0 NaN. As the CPU chain: NaN -> 0, +-inf -> +-max
        penalised = tl.where(penalised != penalised, 0.0, penalised)
        penalised = tl.minimum(tl.maximum(penalised, -FLOAT32_MAX), FLOAT32_MAX)
        tl.store(ptrs, penalised, mask=valid & first)


@triton.jit
def _exp_noise(seeds_ptr, row, cols, num_rows, vocab):
    # Exp(1) noise of columns `cols` of sampling row `row` (int32), keyed by (its sequence's seed, its index in
    # [rows, V])
    seed = tl.load(seeds_ptr + row // num_rows)
    bits = tl.randint(seed, (row % num_rows) * vocab + cols)  # uint32, Philox 4x32-10
    u = ((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)  # 24-bit uniform in (0, 1): no log(0)
    return -tl.log(u)


@triton.jit
def _noise_kernel(seeds_ptr, out_ptr, num_rows, vocab, BLOCK: tl.constexpr):
    # program (row, tile of BLOCK ids)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    noise = _exp_noise(seeds_ptr, row, cols, num_rows, vocab)
    tl.store(out_ptr + row.to(tl.int64) * vocab + cols, noise, mask=cols < vocab)


@triton.jit
def _sample_kernel(logits_ptr, seeds_ptr, mask_eos_ptr, eos_ids_ptr, top_p_ptr, top_k_ptr, tokens_ptr, ids_ptr,
                   logits_stride, num_rows, vocab, WRITE_IDS: tl.constexpr, TOP: tl.constexpr, MIN_KEEP: tl.constexpr,
                   COLUMN_BITS: tl.constexpr, PROBES: tl.constexpr, ROUNDS: tl.constexpr, TOP_BLOCK: tl.constexpr,
                   ONE_TILE: tl.constexpr, BLOCK: tl.constexpr):
    # one program per row: top-p + top-k where TOP, EOS masked where asked, softmax, then argmax(p / E),
    # E ~ Exp(1) (one multinomial draw), the first column on ties as torch's argmax
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * logits_stride
    eos = tl.where(tl.load(mask_eos_ptr + row) != 0, tl.load(eos_ids_ptr + row), -1)
    cut = tl.full([], -2**62, tl.int64)  # no key is <= cut, no value < kth: nothing dropped
    kth = tl.full([], float("-inf"), tl.float32)
    if TOP:
        cut, kth = top_p_top_k_cut(row_ptr, vocab, tl.load(top_p_ptr + row), tl.load(top_k_ptr + row), MIN_KEEP,
                                   COLUMN_BITS, PROBES, ROUNDS, TOP_BLOCK, ONE_TILE)
    peak = tl.full([], float("-inf"), tl.float32)
    total = tl.full([], 0.0, tl.float32)
    best, token = tl.full([], -1.0, tl.float32), tl.full([], 0, tl.int32)
    for scan in tl.static_range(3):  # the peak, the sum, the draw: each reads the row once
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf"))
            bits = (x + 0.0).to(tl.int32, bitcast=True)  # top_p_top_k.dropped, inline (a call costs the interpreter)
            keys = ((bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64) << COLUMN_BITS) + cols
            x = tl.where((cols == eos) | (keys <= cut) | (x < kth), float("-inf"), x)
            if scan == 0:
                peak = tl.maximum(peak, tl.reduce(x, 0, tl.standard._elementwise_max))
            elif scan == 1:
                total += tl.reduce(tl.exp(x - peak), 0, tl.standard._sum_combine)
            else:
                p = tl.div_rn(tl.exp(x - peak), total)
                score = tl.div_rn(p, _exp_noise(seeds_ptr, row, cols, num_rows, vocab))
                # the noise is 0 where u rounds to 1 (2^-24 of the draws): a dropped column (p = 0) gets 0 / 0,
                # NaN, and must not win (torch's argmax would pick it); p / 0 for a kept column is -inf
                # (-log(1) = -0), as torch
                score = tl.where((cols < vocab) & (score == score), score, -1.0)
                tile_best = tl.max(score, 0)
                tile_token = start + tl.argmax(score, 0, tie_break_left=True)
                token = tl.where(tile_best > best, tile_token, token)
                best = tl.maximum(tile_best, best)
    tl.store(tokens_ptr + row, token.to(tl.int64))
    if WRITE_IDS:
        tl.store(ids_ptr + row, token.to(tl.int64))


def apply_temperature_and_penalty(
    logits: torch.Tensor, temperatures: torch.Tensor, history: torch.Tensor, penalties: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """logits [R, V] / temperatures [R], then the repetition penalty, into out [R, V] fp32 (default: logits, which
    must then be fp32; modified in place). Returns out.

    history [R, W] int ids of each row's recent generated tokens, -1 = padding; penalties [R], 1.0 = off.
    """
    out = logits if out is None else out
    rows, vocab = _check_logits(out)
    if logits.shape != out.shape or logits.stride(1) != 1 or not logits.is_floating_point():
        raise ValueError(f"apply_temperature_and_penalty: logits must be float [{rows}, {vocab}] with contiguous "
                         f"rows, got {tuple(logits.shape)} {logits.dtype}")
    if temperatures.shape != (rows,) or penalties.shape != (rows,) or history.dim() != 2 or len(history) != rows:
        raise ValueError(f"apply_temperature_and_penalty: need temperatures, penalties [{rows}], history [{rows}, W];"
                         f" got {tuple(temperatures.shape)}, {tuple(penalties.shape)}, {tuple(history.shape)}")
    width = history.shape[1]
    if history.stride(1) != 1:  # rows may be strided (a view without a scratch column): the kernel takes the stride
        history = history.contiguous()
    _temperature_penalty_kernel[(rows,)](
        logits, out, temperatures.float().contiguous(), history, penalties.float().contiguous(), logits.stride(0),
        out.stride(0), history.stride(0), vocab, width, BLOCK_V=min(4096, triton.next_power_of_2(vocab)),
        BLOCK_W=HISTORY_TILE, num_warps=4, **EAGER)
    return out


def mask_eos(logits: torch.Tensor, rows: torch.Tensor, eos_ids: torch.Tensor) -> torch.Tensor:
    """logits[r, eos_ids[r]] = -inf where rows[r] (rows [R] bool, eos_ids [R] int); in place, no host sync."""
    num_rows, _ = _check_logits(logits)
    if rows.shape != (num_rows,) or eos_ids.shape != (num_rows,):
        raise ValueError(f"mask_eos: rows and eos_ids must be [{num_rows}], got "
                         f"{tuple(rows.shape)} and {tuple(eos_ids.shape)}")
    index = eos_ids.long().unsqueeze(1)
    masked = logits.gather(1, index).masked_fill(rows.unsqueeze(1), float("-inf"))
    return logits.scatter_(1, index, masked)


def noise_seeds(step_seeds: list[int], device: torch.device | str) -> torch.Tensor:
    """[S] int64 on device: each sequence's 64-bit step_seed(seed, step), its bits kept (two's complement)."""
    signed = [s - (1 << 64) if s >= 1 << 63 else s for s in step_seeds]
    return torch.tensor(signed, dtype=torch.int64, device=device)


def exponential_noise(seeds: torch.Tensor, num_rows: int, vocab: int) -> torch.Tensor:
    """Exp(1) noise [S * num_rows, V] fp32 on seeds' device; sequence s's block depends only on seeds[s]."""
    if seeds.dim() != 1 or seeds.dtype != torch.int64 or num_rows < 1 or vocab < 1:
        raise ValueError(f"exponential_noise: need seeds [S] int64 (noise_seeds), num_rows and vocab >= 1, got "
                         f"{tuple(seeds.shape)} {seeds.dtype}, {num_rows}, {vocab}")
    out = torch.empty(seeds.shape[0] * num_rows, vocab, dtype=torch.float32, device=seeds.device)
    grid = (out.shape[0], triton.cdiv(vocab, NOISE_BLOCK))
    _noise_kernel[grid](seeds, out, num_rows, vocab, BLOCK=NOISE_BLOCK, **EAGER)
    return out


def sample(logits: torch.Tensor, seeds: torch.Tensor, num_rows: int, mask_eos: torch.Tensor | None = None,
           eos_ids: torch.Tensor | None = None, ids_out: torch.Tensor | None = None,
           top_p: torch.Tensor | None = None, top_k: torch.Tensor | None = None) -> torch.Tensor:
    """argmax(softmax(logits) / E), E ~ Exp(1) (one multinomial draw per row): logits [S*rows, V] -> [S, rows], in
    one launch; logits are not modified. With top_p [S*rows] float and top_k [S*rows] int, top-p + top-k first (as
    apply_top_p_top_k). With mask_eos [S*rows] (bool or int, nonzero = forbid) and eos_ids [S*rows], EOS is masked
    next (as mask_eos). ids_out [S, rows] int64, if given, receives the tokens too."""
    rows, vocab = _check_logits(logits)
    if rows != seeds.shape[0] * num_rows:
        raise ValueError(f"sample: logits need {seeds.shape[0]} * {num_rows} rows, got {rows}")
    if ids_out is not None and (ids_out.shape != (seeds.shape[0], num_rows) or not ids_out.is_contiguous()):
        raise ValueError(f"sample: ids_out must be [{seeds.shape[0]}, {num_rows}] contiguous, got "
                         f"{tuple(ids_out.shape)}")
    if mask_eos is None or eos_ids is None:
        mask_eos = eos_ids = torch.zeros(rows, dtype=torch.int64, device=logits.device)
    elif mask_eos.shape != (rows,) or eos_ids.shape != (rows,):
        raise ValueError(f"sample: mask_eos and eos_ids must be [{rows}], got {tuple(mask_eos.shape)} and "
                         f"{tuple(eos_ids.shape)}")
    top = (seeds, seeds)  # unread: no top-p / top-k
    if top_p is not None and top_k is not None:
        if top_p.shape != (rows,) or top_k.shape != (rows,):
            raise ValueError(f"sample: top_p and top_k must be [{rows}], got {tuple(top_p.shape)} and "
                             f"{tuple(top_k.shape)}")
        top = (top_p.float().contiguous(), top_k.long().contiguous())
    search = search_for(vocab)
    tokens = torch.empty(seeds.shape[0], num_rows, dtype=torch.int64, device=logits.device)
    _sample_kernel[(rows,)](logits, seeds, mask_eos.contiguous(), eos_ids.contiguous(), *top, tokens,
                            tokens if ids_out is None else ids_out, logits.stride(0), num_rows, vocab,
                            WRITE_IDS=ids_out is not None, TOP=top[0] is not seeds, MIN_KEEP=MIN_KEEP,
                            COLUMN_BITS=COLUMN_BITS, PROBES=search["PROBES"], ROUNDS=search["ROUNDS"],
                            TOP_BLOCK=search["BLOCK"], ONE_TILE=search["ONE_TILE"],
                            BLOCK=min(2048, triton.next_power_of_2(vocab)), num_warps=4, **EAGER)
    return tokens


def _check_logits(logits: torch.Tensor) -> tuple[int, int]:
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.stride(1) != 1:
        raise ValueError(f"logits: need [R, V] float32 with contiguous rows, got {tuple(logits.shape)} {logits.dtype}")
    return logits.shape[0], logits.shape[1]
