"""Engine stage: the KV pool's size — blocks that fit the user's budget (bytes, or a fraction of RAM / free VRAM).

In: ModelConfig (layers, heads, head_dim) and EngineConfig (kv_cache_memory, block_size, max_model_len,
max_num_seqs, device, precision.kv_cache). Out: the number of KV blocks, or a ValueError naming kv_cache_memory.
"""
from __future__ import annotations

import logging
import os

import torch

from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.model import kv_cache_bytes_per_block

logger = logging.getLogger("chattts_velocity")
DEFAULT_KV_BYTES = 1 << 30  # 1 GiB on CPU when the user gives no budget
DEFAULT_VRAM_FRACTION = 0.6  # on CUDA: of the VRAM still free once the weights are in (activations need the rest)


def kv_cache_blocks(config: ModelConfig, engine_config: EngineConfig) -> int:
    """Blocks that fit the user's KV budget (bytes, or a fraction of RAM / VRAM); clear error if too few.

    Without a budget on CPU: 1 GiB, but no more than max_num_seqs sequences of max_model_len positions need.
    """
    per_block = kv_cache_bytes_per_block(config.num_hidden_layers, engine_config.block_size,
                                         config.num_attention_heads, config.head_dim,
                                         engine_config.precision.kv_cache)
    budget = budget_bytes(engine_config.kv_cache_memory, engine_config.device)
    num_blocks = int(budget // per_block)
    needed = -(-engine_config.max_model_len // engine_config.block_size)
    if engine_config.kv_cache_memory is None:
        # the defaults (1 GiB on CPU, zero-filled: all resident; a fraction of free VRAM on CUDA) never exceed what
        # max_num_seqs full-length sequences can hold at once (64 x 4096 positions of ChatTTS: ~16 GB in bf16, where
        # 0.6 of an H100's free VRAM would be ~46 GB); a tiny model's pool shrinks to that
        num_blocks = min(num_blocks, engine_config.max_num_seqs * needed)
    if num_blocks < needed:
        raise ValueError(
            f"kv_cache_memory: {budget / 2**20:.1f} MiB holds {num_blocks} KV blocks of {engine_config.block_size} "
            f"positions, but one sequence of max_model_len={engine_config.max_model_len} needs {needed} "
            f"({needed * per_block / 2**20:.1f} MiB); raise kv_cache_memory or lower max_model_len"
        )
    logger.info("KV cache: %d blocks of %d positions = %.1f MiB on %s (%d sequences of max_model_len=%d fit)",
                num_blocks, engine_config.block_size, num_blocks * per_block / 2**20, engine_config.device,
                num_blocks // needed, engine_config.max_model_len)
    return num_blocks


def budget_bytes(value: float | None, device: str | torch.device) -> float:
    """Bytes for the KV pool: a number of bytes, or a fraction of the device's memory (of the FREE VRAM on CUDA,
    measured after the weights are loaded); None: 1 GiB on CPU, DEFAULT_VRAM_FRACTION of free VRAM on CUDA."""
    on_cuda = str(device).startswith("cuda")
    if value is None:
        value = DEFAULT_VRAM_FRACTION if on_cuda else DEFAULT_KV_BYTES
    if isinstance(value, float) and 0 < value <= 1:
        if on_cuda:
            return value * torch.cuda.mem_get_info(torch.device(device))[0]
        return value * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if value <= 0:
        raise ValueError(f"kv_cache_memory: must be > 0 bytes or a fraction in (0, 1], got {value!r}")
    return float(value)
