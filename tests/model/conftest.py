"""Fixtures for the model-stage tests: the tiny GPT config, a random HF LlamaModel, a minimal paged runner and the
CPU kernels' ISA (every test that takes `isa` runs once per ISA this host can run)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaModel

from chattts_velocity.config import ModelConfig
from chattts_velocity.model import ChatTTSLlama, allocate_kv_pairs, build_attention_metadata, kernels

TINY = ModelConfig(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=512,
)


def make_hf_llama(cfg: ModelConfig = TINY, seed: int = 0) -> LlamaModel:
    """A random fp32 HF LlamaModel with SDPA attention; norm weights randomised too so they are tested."""
    hf_cfg = LlamaConfig(
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta,
        max_position_embeddings=cfg.max_position_embeddings,
        vocab_size=32,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    model = LlamaModel(hf_cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def paged_from_hf(hf: LlamaModel, cfg: ModelConfig = TINY) -> ChatTTSLlama:
    model = ChatTTSLlama(cfg).eval()
    state = {k: v for k, v in hf.state_dict().items() if k != "embed_tokens.weight"}
    model.load_state_dict(state, strict=True)
    return model


class PagedRunner:
    """Just enough of a model runner: shuffled block allocation, per-sequence lengths, one forward per step."""

    def __init__(self, model: ChatTTSLlama, num_blocks: int, block_size: int, seed: int = 0) -> None:
        cfg = model.config
        self.model = model
        self.block_size = block_size
        self.kv = allocate_kv_pairs(
            cfg.num_hidden_layers, num_blocks, block_size, cfg.num_attention_heads, cfg.head_dim
        )
        self.free = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def plan(self, chunks: list[tuple[int, torch.Tensor]]) -> tuple[list[int], list[int], list[list[int]]]:
        q_lens, k_lens, tables = [], [], []
        for seq_id, emb in chunks:
            new_len = self.lens.get(seq_id, 0) + emb.shape[0]
            table = self.tables.setdefault(seq_id, [])
            while len(table) * self.block_size < new_len:
                table.append(self.free.pop())
            self.lens[seq_id] = new_len
            q_lens.append(emb.shape[0])
            k_lens.append(new_len)
            tables.append(list(table))
        return q_lens, k_lens, tables

    def step(self, chunks: list[tuple[int, torch.Tensor]], force_general: bool = False) -> list[torch.Tensor]:
        """chunks: (seq_id, new embeddings [q, H]) -> hidden [q, H] per chunk."""
        q_lens, k_lens, tables = self.plan(chunks)
        meta = build_attention_metadata(q_lens, k_lens, tables, self.block_size)
        if force_general:
            meta = replace(meta, decode_only=False)
        with torch.no_grad():
            hidden = self.model(torch.cat([emb for _, emb in chunks]), meta.positions, self.kv, meta)
        return list(hidden.split(q_lens))


@pytest.fixture(scope="module")
def hf_llama() -> LlamaModel:
    return make_hf_llama()


@pytest.fixture(scope="module")
def paged_llama(hf_llama: LlamaModel) -> ChatTTSLlama:
    return paged_from_hf(hf_llama)


@pytest.fixture
def make_runner(paged_llama: ChatTTSLlama) -> Callable[..., PagedRunner]:
    def make(num_blocks: int = 64, block_size: int = 16, seed: int = 0) -> PagedRunner:
        return PagedRunner(paged_llama, num_blocks, block_size, seed)

    return make


@pytest.fixture
def tiny_config() -> ModelConfig:
    return TINY


# The ISA the runtime picks here runs in the default suite; the others (a cold build of each, about 25 s on 2
# cores) in the slow suite, which CI runs too.
@pytest.fixture(params=[pytest.param(i, marks=() if i == kernels.isa() else pytest.mark.slow) for i in kernels.ISAS])
def isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The C++ kernels of one ISA in use (CHATTTS_VELOCITY_CPU_KERNELS), skipped where this CPU cannot run them."""
    monkeypatch.setenv(kernels.ENV_SWITCH, request.param)
    reason = kernels.unsupported()
    if reason is not None:
        pytest.skip(f"the {request.param} kernels cannot run here: {reason}")
    assert kernels.isa() == request.param and kernels.load()
    return request.param
