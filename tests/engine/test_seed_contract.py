"""The seed contract in the fast modes: a seeded request gives the same codes and hidden states alone, in any batch,
at any position in it and after preemption, with the engine's bf16, int8 and int4 cpu backend (batch-invariant
kernels, prefill rows through the decode op), on every kernel ISA this CPU can run (AVX2 on any x86 CPU with AVX2 +
FMA). The model is small but has head_dim 32, which the fused C++ layers need."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.llm_engine import LLMEngine
from chattts_velocity.model import ChatTTSLlama, Embed, kernels, kv_cache_bytes_per_block
from chattts_velocity.schema import Prompt, SamplingParams

UNSUPPORTED = kernels.unsupported()
pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=f"CPU kernels unsupported here: {UNSUPPORTED}")
HIDDEN, HEADS, LAYERS, BLOCK, STEPS = 128, 4, 2, 4, 40
CONFIG = ModelConfig(hidden_size=HIDDEN, intermediate_size=256, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                     max_position_embeddings=512, num_audio_tokens=626, num_text_tokens=50)


# the ISA the runtime picks here in the default suite; the others (a cold build each) in the slow suite
@pytest.fixture(params=[pytest.param(i, marks=() if i == kernels.isa() else pytest.mark.slow) for i in kernels.ISAS])
def isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(kernels.ENV_SWITCH, request.param)
    if kernels.unsupported() is not None:
        pytest.skip(f"the {request.param} kernels cannot run here: {kernels.unsupported()}")
    return request.param


def _engine(mode: str, **options) -> LLMEngine:
    gen = torch.Generator().manual_seed(0)
    model, embed = ChatTTSLlama(CONFIG), Embed(HIDDEN, 626, 50, 4)
    with torch.no_grad():
        for name, p in [*model.named_parameters(), *embed.named_parameters()]:
            p.copy_(torch.rand(p.shape, generator=gen) + 0.5 if "norm" in name and p.dim() == 1
                    else torch.randn(p.shape, generator=gen) * (0.3 if "emb" in name or "head" in name else 0.08))
    engine = LLMEngine(model.eval(), embed.eval(), CONFIG,
                       EngineConfig.from_kwargs(dtype=mode, block_size=BLOCK,
                                                **{"kv_cache_memory": 1 << 22, **options}))
    assert engine.runner.backend.name == "cpu"
    return engine


def _request(i: int) -> tuple[Prompt, SamplingParams]:
    ids = (torch.arange(3 + 2 * i) * 7 + i) % 50  # text prompts of different lengths
    params = SamplingParams(temperature=0.7, top_p=0.7, top_k=20, repetition_penalty=1.05, seed=100 + i,
                            max_new_token=STEPS, min_new_token=STEPS)
    return Prompt(ids[:, None].repeat(1, 4), torch.ones(len(ids), dtype=torch.bool)), params


def _run(engine: LLMEngine, which: list[int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """request i -> (codes [STEPS, 4], hidden states [STEPS, H]) with requests `which` submitted in that order."""
    codes: dict[str, list] = {}
    for i in which:
        engine.add_request(f"r{i}", *_request(i))
    while engine.has_unfinished_requests():
        for out in engine.step():
            codes.setdefault(out.request_id, []).append((out.token_ids, out.hidden))
    assert engine.block_manager.num_used_blocks == 0
    return {i: (torch.cat([c for c, _ in codes[f"r{i}"]]), torch.cat([h for _, h in codes[f"r{i}"]])) for i in which}


@pytest.mark.parametrize("mode,kv", [("bfloat16", "auto"), ("bfloat16", "int8"), ("int8", "auto"), ("int8", "int8"),
                                     ("int4", "auto")])  # kv: kv_cache_dtype
def test_a_seeded_request_is_the_same_alone_in_any_batch_and_after_preemption(isa: str, mode: str, kv: str) -> None:
    engine = _engine(mode, kv_cache_dtype=kv)
    assert engine.runner.backend.fused.layers[0].ops is kernels.ops(isa)
    alone = {i: _run(engine, [i])[i] for i in (0, 5)}
    batches = [[0, 1, 2], [3, 4, 0, 5, 6, 7, 1, 2], [*range(15, 5, -1), 5, 0, 1, 2, 3, 4]]  # 3, 8 and 16 requests
    for which in batches:
        together = _run(engine, which)
        for i in (0, 5):
            if i in together:
                assert torch.equal(together[i][0], alone[i][0]), (mode, which, i)
                assert torch.equal(together[i][1], alone[i][1])
    # 24 blocks of 4 positions cannot hold 8 sequences of ~50: the scheduler preempts and recomputes
    block_bytes = kv_cache_bytes_per_block(LAYERS, BLOCK, HEADS, HIDDEN // HEADS,
                                           torch.int8 if kv == "int8" else torch.bfloat16)
    tight = _engine(mode, kv_cache_dtype=kv, kv_cache_memory=24 * block_bytes, max_model_len=96)
    crowded = _run(tight, [5, 0, *range(1, 5), 6, 7])
    assert tight.scheduler.num_preemptions > 0
    for i in (0, 5):
        assert torch.equal(crowded[i][0], alone[i][0]) and torch.equal(crowded[i][1], alone[i][1])
    assert len({tuple(c.flatten().tolist()) for c, _ in crowded.values()}) == len(crowded)  # seeds differ: codes do


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["bfloat16", "int8"])
def test_public_api_gives_a_seeded_text_the_same_audio_alone_and_among_others(full_assets, mode: str) -> None:
    from chattts_velocity import Chat, InferCodeParams

    chat = Chat()
    # float32 audio decode: the GPT's codes are what the contract holds (bf16 Decoder/Vocos convolutions depend on
    # the batch by ~5e-3, measured; docs/fidelity.md)
    chat.load(source="custom", custom_path=full_assets, verify=False, dtype=mode, use_vllm=True, decode_dtype="float32")
    assert chat.engine().runner.backend.name == "cpu"
    target = "The request we follow, word for word."
    others = [f"Another sentence, number {i}, rather longer than the first." for i in range(7)]
    params = InferCodeParams(manual_seed=7, max_new_token=24, show_tqdm=False)
    alone = chat.infer([target], skip_refine_text=True, params_infer_code=params, use_vllm=True)[0]
    among = chat.infer(others[:3] + [target] + others[3:], skip_refine_text=True, params_infer_code=params,
                       use_vllm=True)[3]
    assert alone.shape == among.shape and len(alone) > 0
    assert abs(alone - among).max() <= 1e-5  # the same codes; fp32 convolutions over another batch: ~1e-6
