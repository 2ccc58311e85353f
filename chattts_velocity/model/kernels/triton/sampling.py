"""Engine stage ops for the CUDA backend, on the logits' device: nothing goes to the host but the sampled ids.

Rows are (sequence, codebook) pairs, logits [R, V] fp32, per-row parameters [R], as in
engine/sampling/logits_processors.py, whose semantics these ops keep (HF top-p / top-k with 3 tokens kept, the
reference's asymmetric penalty).
The caller applies them in engine/sampling/sampler.py's order: temperature + penalty, top-p + top-k, custom
processors, EOS mask, then `sample`.

NOTE (noise): `sample` draws its Exp(1) noise with Philox in Triton, keyed by the request's step seed
(engine/sampling/sampler.step_seed) and the element's index inside the request's [rows, V] block. Like the CPU path it
depends only on (seed, step), never on the batch, so batch invariance holds; but it is a different stream
from the CPU path's torch.Generator (same distribution), so a seed gives different audio on CUDA than on CPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

MIN_KEEP = 3  # tokens top-p and top-k always keep, as logits_processors
NOISE_BLOCK = 1024  # vocabulary entries per noise program
EAGER = {"enable_fp_fusion": False}  # no fused multiply-adds, as torch's eager ops
HISTORY_TILE = 16  # history ids per tile of the penalty (the default penalty window)
FLOAT32_MAX = tl.constexpr(3.4028234663852886e38)  # torch.finfo(torch.float32).max


@triton.jit(do_not_specialize=["history_stride", "width"])
def _temperature_penalty_kernel(logits_ptr, temperatures_ptr, history_ptr, penalties_ptr, logits_stride,
                                history_stride, vocab, width, BLOCK_V: tl.constexpr, BLOCK_W: tl.constexpr):
    # one program per row: divide the row by its temperature, then penalise the ids of its history window, visited
    # in tiles of BLOCK_W (one compiled variant for every window width)
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * logits_stride
    temperature = tl.load(temperatures_ptr + row)
    for start in range(0, vocab, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = tl.load(row_ptr + cols, mask=cols < vocab)
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
def _noise_kernel(seeds_ptr, out_ptr, num_rows, vocab, BLOCK: tl.constexpr):
    # program (row, tile of BLOCK ids): Exp(1) noise keyed by (its sequence's seed, its index in [rows, V])
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    seed = tl.load(seeds_ptr + row // num_rows)
    bits = tl.randint(seed, (row % num_rows) * vocab + cols)  # uint32, Philox 4x32-10
    u = ((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)  # 24-bit uniform in (0, 1): no log(0)
    tl.store(out_ptr + row.to(tl.int64) * vocab + cols, -tl.log(u), mask=cols < vocab)


def apply_temperature_and_penalty(
    logits: torch.Tensor, temperatures: torch.Tensor, history: torch.Tensor, penalties: torch.Tensor
) -> torch.Tensor:
    """logits [R, V] fp32 (modified in place and returned) / temperatures [R], then the repetition penalty.

    history [R, W] int ids of each row's recent generated tokens, -1 = padding; penalties [R], 1.0 = off.
    """
    rows, vocab = _check_logits(logits)
    if temperatures.shape != (rows,) or penalties.shape != (rows,) or history.dim() != 2 or len(history) != rows:
        raise ValueError(f"apply_temperature_and_penalty: need temperatures, penalties [{rows}], history [{rows}, W];"
                         f" got {tuple(temperatures.shape)}, {tuple(penalties.shape)}, {tuple(history.shape)}")
    width = history.shape[1]
    history = history.contiguous()
    _temperature_penalty_kernel[(rows,)](
        logits, temperatures.float().contiguous(), history, penalties.float().contiguous(), logits.stride(0),
        history.stride(0), vocab, width, BLOCK_V=min(4096, triton.next_power_of_2(vocab)),
        BLOCK_W=HISTORY_TILE, num_warps=4, **EAGER)
    return logits


def apply_top_p_top_k(
    logits: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor, min_keep: int = MIN_KEEP
) -> torch.Tensor:
    """HF top-p then HF top-k over one stable ascending sort of logits [R, V] (modified in place and returned).

    top_p [R] float (>= 1 = off), top_k [R] int (<= 0 = off). Top-p drops a prefix of the ascending order, so
    after it the sorted row is still sorted, and the k-th largest survivor is at column V - k: one sort, no
    host sync (logits_processors.apply_top_k reads max(k) on the host).
    """
    rows, vocab = _check_logits(logits)
    if top_p.shape != (rows,) or top_k.shape != (rows,):
        raise ValueError(f"apply_top_p_top_k: top_p and top_k must be [{rows}], got "
                         f"{tuple(top_p.shape)} and {tuple(top_k.shape)}")
    ascending, order = torch.sort(logits, dim=-1, stable=True)
    drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p).unsqueeze(1)
    drop[:, -min_keep:] = False
    drop &= (top_p < 1).unsqueeze(1)
    ascending = ascending.masked_fill(drop, float("-inf"))
    k = top_k.clamp(min=min_keep, max=vocab)
    kth = ascending.gather(1, (vocab - k).unsqueeze(1))  # [R, 1]
    ascending = ascending.masked_fill((ascending < kth) & (top_k > 0).unsqueeze(1), float("-inf"))
    return logits.scatter_(1, order, ascending)


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


def sample(logits: torch.Tensor, seeds: torch.Tensor, num_rows: int) -> torch.Tensor:
    """argmax(softmax(logits) / E), E ~ Exp(1) (one multinomial draw per row): logits [S*rows, V] -> [S, rows]."""
    rows, vocab = _check_logits(logits)
    if rows != seeds.shape[0] * num_rows:
        raise ValueError(f"sample: logits need {seeds.shape[0]} * {num_rows} rows, got {rows}")
    probs = logits.softmax(dim=-1)
    return probs.div_(exponential_noise(seeds, num_rows, vocab)).argmax(dim=-1).view(-1, num_rows)


def _check_logits(logits: torch.Tensor) -> tuple[int, int]:
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.stride(1) != 1:
        raise ValueError(f"logits: need [R, V] float32 with contiguous rows, got {tuple(logits.shape)} {logits.dtype}")
    return logits.shape[0], logits.shape[1]
