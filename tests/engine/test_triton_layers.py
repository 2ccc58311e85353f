"""The triton backend's decode step (engine/worker/backends/triton_layers.py): five kernel launches a layer, and a row's
hidden state bit-identical alone, among 3 and among 64 sequences (the seed contract's device half).

Launches are counted by wrapping Triton's launch (the interpreter's on CPU, the JIT's on CUDA).
"""
from __future__ import annotations

import os
from collections import Counter

import pytest
import torch

from chattts_velocity.config import ModelConfig
from chattts_velocity.engine.worker.step_inputs import PagedKV
from chattts_velocity.model import ChatTTSLlama, DecodeMetadata, allocate_kv_pairs
from chattts_velocity.model.kernels.triton import available

REASON = available()
pytestmark = [pytest.mark.triton, pytest.mark.skipif(REASON is not None, reason=f"Triton unavailable: {REASON}")]
LAYERS, BLOCK, BLOCKS_PER_SEQ, SEQS = 2, 4, 6, 64
CONFIG = ModelConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4,
                     num_key_value_heads=4, max_position_embeddings=256)
FUSED = ["_norm_qkv_rope_kernel", "_decode_kernel", "_residual_linear_kernel", "_norm_gate_up_kernel",
         "_residual_linear_kernel"]


@pytest.fixture(scope="module")
def backend(triton_device):
    from chattts_velocity.engine.worker.backends.triton_backend import TritonBackend

    gen = torch.Generator().manual_seed(0)
    model = ChatTTSLlama(CONFIG)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.rand(p.shape, generator=gen) + 0.5 if "norm" in name
                    else torch.randn(p.shape, generator=gen) * 0.05)
    num_blocks = SEQS * BLOCKS_PER_SEQ
    pairs = allocate_kv_pairs(LAYERS, num_blocks + 1, BLOCK, CONFIG.num_attention_heads, CONFIG.head_dim,
                              device=triton_device)
    for pool in (t for pair in pairs for t in pair):
        pool.copy_(torch.randn(pool.shape, generator=gen))  # contexts already cached
    kv = PagedKV(pairs, BLOCK, pad_block=num_blocks, device=torch.device(triton_device))
    return TritonBackend(model.eval().to(triton_device), kv, torch.float32, max_num_seqs=SEQS, max_model_len=64)


def decode_inputs(backend, rows: list[int]):
    """A decode step of sequences `rows` (sequence b owns blocks 6b .. 6b + 5; context 1 .. 24 positions)."""
    device = backend.kv.device
    gen = torch.Generator().manual_seed(1)
    embeds = torch.randn(SEQS, CONFIG.hidden_size, generator=gen)[rows].to(device)
    context = (torch.arange(SEQS) * 7 % (BLOCKS_PER_SEQ * BLOCK) + 1)[rows]
    tables = (torch.arange(SEQS)[:, None] * BLOCKS_PER_SEQ + torch.arange(BLOCKS_PER_SEQ))[rows]
    positions = context - 1
    slots = tables.gather(1, (positions // BLOCK)[:, None])[:, 0] * BLOCK + positions % BLOCK
    meta = DecodeMetadata(slots.to(device), tables.to(device), context.to(device))
    return embeds, positions.to(device), meta


@pytest.fixture
def launches(monkeypatch):
    """Counter of kernel names launched while the fixture is active."""
    counted: Counter[str] = Counter()
    if os.environ.get("TRITON_INTERPRET") == "1":
        from triton.runtime.interpreter import InterpretedFunction as Launched
    else:
        from triton.runtime.jit import JITFunction as Launched
    original = Launched.run

    def run(self, *args, **kwargs):
        counted[self.fn.__name__ if hasattr(self, "fn") else self.__name__] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Launched, "run", run)
    return counted


@torch.inference_mode()
def test_a_decode_step_launches_five_kernels_a_layer(backend, launches) -> None:
    backend.decode_step(*decode_inputs(backend, [0, 1, 2]))
    layer_body = sum(launches.values()) - launches["_rms_norm_kernel"]
    assert launches["_rms_norm_kernel"] == 1  # the final norm, once a step
    assert layer_body / LAYERS <= 5 and layer_body == LAYERS * len(FUSED)
    assert launches == Counter({name: LAYERS * FUSED.count(name) for name in FUSED} | {"_rms_norm_kernel": 1})


@torch.inference_mode()
def test_a_rows_hidden_state_is_the_same_alone_and_in_batches_of_3_and_64(backend) -> None:
    full = backend.decode_step(*decode_inputs(backend, list(range(SEQS))))
    assert full.isfinite().all() and full.std() > 0
    for rows in ([40], [5, 6, 7], [13]):
        alone = backend.decode_step(*decode_inputs(backend, rows))
        assert torch.equal(alone, full[rows]), rows
    assert not torch.equal(full[5], full[6])



def test_packed_weights_hold_the_checkpoints_linears(backend) -> None:
    for layer, packed in zip(backend.model.layers, backend.layers.layers, strict=True):
        attn, mlp = layer.self_attn, layer.mlp
        for fused, linears in ((packed.qkv, (attn.q_proj, attn.k_proj, attn.v_proj)),
                               (packed.gate_up, (mlp.gate_proj, mlp.up_proj))):
            assert torch.equal(fused, torch.cat([linear.weight for linear in linears]))
            for linear in linears:  # views into the packed tensor: no second copy
                assert linear.weight.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
