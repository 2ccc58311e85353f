"""The seed contract on the torch backend (CPU): a seeded request gives the same codes and bit-identical hidden
states alone and among 3, 8 and 32 requests, in float32 and bf16 (fixed 8-row GEMM tiles, one SDPA call per
sequence), and the tiles themselves give a row the same bits at every row count and position."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.llm_engine import LLMEngine
from chattts_velocity.model import ChatTTSLlama, Embed
from chattts_velocity.model.layers import tiled_linear
from chattts_velocity.schema import Prompt, SamplingParams

HIDDEN, STEPS = 128, 12
CONFIG = ModelConfig(hidden_size=HIDDEN, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                     max_position_embeddings=512, num_audio_tokens=626, num_text_tokens=50)


def _engine(mode: str, **config) -> LLMEngine:
    gen = torch.Generator().manual_seed(0)
    model, embed = ChatTTSLlama(CONFIG), Embed(HIDDEN, 626, 50, 4)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *embed.named_parameters()]:
            p.copy_(torch.rand(p.shape, generator=gen) + 0.5 if "norm" in name and p.dim() == 1
                    else torch.randn(p.shape, generator=gen) * (0.3 if "emb" in name or "head" in name else 0.08))
    engine = LLMEngine(model.eval(), embed.eval(), CONFIG,
                       EngineConfig.from_kwargs(**{"dtype": mode, "block_size": 4, "kv_cache_memory": 1 << 23,
                                                   "backend": "torch", **config}))
    assert engine.runner.backend.name == "torch"
    return engine


def _run(engine: LLMEngine, which: list[int], seeds: dict[int, int] | None = None, steps: int = STEPS,
         ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """request i -> (codes [steps, 4], hidden states [steps, H]), requests `which` submitted in that order.
    Request i's prompt is 3 + 2i text tokens; requests 0 and 20 share their first 3."""
    outs: dict[str, list] = {}
    for i in which:
        ids = (torch.arange(3 + 2 * i) * 7 + i % 20) % 50  # text prompts of different lengths
        seed = (seeds or {}).get(i, 100 + i)
        params = SamplingParams(temperature=0.7, top_p=0.7, top_k=20, repetition_penalty=1.05, seed=seed,
                                max_new_token=steps, min_new_token=steps)
        engine.add_request(f"r{i}", Prompt(ids[:, None].repeat(1, 4), torch.ones(len(ids), dtype=torch.bool)), params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            outs.setdefault(out.request_id, []).append((out.token_ids, out.hidden))
    return {i: (torch.cat([c for c, _ in outs[f"r{i}"]]), torch.cat([h for _, h in outs[f"r{i}"]])) for i in which}


BATCHES = {"3": [1, 0, 2], "8": [3, 4, 0, 5, 6, 7, 1, 2], "32": [*range(31, 0, -1), 0]}


@pytest.mark.parametrize("mode", ["float32", "bfloat16"])
@pytest.mark.parametrize("batch", ["3", "8", pytest.param("32", marks=pytest.mark.slow)])
def test_a_seeded_request_is_the_same_bits_alone_and_in_any_batch(mode: str, batch: str) -> None:
    engine = _engine(mode)
    alone = _run(engine, [0])[0]
    together = _run(engine, BATCHES[batch])[0]
    assert torch.equal(together[0], alone[0]) and torch.equal(together[1], alone[1])


def test_tiled_linear_gives_a_row_the_same_bits_at_every_row_count() -> None:
    g = torch.Generator().manual_seed(0)
    weight, x = torch.randn(384, 128, generator=g) * 0.05, torch.randn(70, 128, generator=g)
    row = tiled_linear(x[:1], weight)[0]
    assert torch.allclose(row, F.linear(x[:1], weight)[0], atol=1e-5)
    for rows in (2, 7, 8, 9, 33, 70):
        among = torch.cat([x[1:rows], x[:1]])  # the row last, after rows - 1 others
        assert torch.equal(tiled_linear(among, weight)[-1], row), rows


def test_a_prompt_is_the_same_bits_after_a_prefix_cache_hit_and_split_by_the_token_budget() -> None:
    # the row that samples first sits in another chunk each time: whole, after 40 cached positions, in chunks of 5
    alone = _run(_engine("float32"), [20])[20]
    warm = _engine("float32")
    _run(warm, [20], seeds={20: 7})  # the same prompt under another seed fills the prefix cache
    after_hit = _run(_recording(warm), [20])[20]
    assert warm.first_rows == [43 - 40]  # 40 prompt positions came from the cache
    split = _run(_recording(_engine("float32", max_num_batched_tokens=5)), [20, 1, 2])[20]
    for got in (after_hit, split):
        assert torch.equal(got[0], alone[0]) and torch.equal(got[1], alone[1])


def test_a_preempted_request_recomputes_the_bits_it_would_have_made() -> None:
    steps = 24
    alone = _run(_engine("float32"), [7], steps=steps)[7]
    tight = _engine("float32", kv_cache_memory=20 * _block_bytes(), max_model_len=64)  # 20 blocks of 4 for 4
    crowded = _run(tight, [1, 2, 3, 7], steps=steps)[7]
    assert tight.scheduler.num_preemptions > 0
    assert torch.equal(crowded[0], alone[0]) and torch.equal(crowded[1], alone[1])


def _recording(engine: LLMEngine) -> LLMEngine:
    """engine, noting in engine.first_rows how many rows each step computes for its first sequence."""
    schedule, engine.first_rows = engine.scheduler.schedule, []

    def recorded():
        batch = schedule()
        if batch.seqs and batch.seqs[0].num_computed_tokens == 0 or not engine.first_rows:
            engine.first_rows.append(batch.num_new_tokens[0])
        return batch
    engine.scheduler.schedule = recorded
    return engine


def _block_bytes() -> int:
    from chattts_velocity.model import kv_cache_bytes_per_block
    return kv_cache_bytes_per_block(CONFIG.num_hidden_layers, 4, CONFIG.num_attention_heads, CONFIG.head_dim)
