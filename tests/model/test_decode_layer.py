"""The fused C++ decode layer (model/fused.py, kernels/cpu_decode_layer.cpp) against the layer-by-layer Python path,
and the engine's cpu backend (tests taking `isa` run on every ISA this CPU can run). The model is small but has
head_dim 32, which the C++ attention needs."""
from __future__ import annotations

import pytest
import torch
from backend_lists import decode, forward
from torch._dynamo.utils import counters

from chattts_velocity.config import EngineConfig, ModelConfig
from chattts_velocity.engine.llm_engine import LLMEngine
from chattts_velocity.model import (
    ChatTTSLlama,
    DecodeMetadata,
    Embed,
    FusedDecoder,
    allocate_kv_pairs,
    build_attention_metadata,
    fused_unavailable,
    kernels,
)
from chattts_velocity.model.attention import dequantize_kv
from chattts_velocity.schema import Prompt, SamplingParams

UNSUPPORTED = kernels.unsupported()
pytestmark = pytest.mark.skipif(UNSUPPORTED is not None, reason=f"CPU kernels unsupported here: {UNSUPPORTED}")
BLOCK = 4
HIDDEN, HEADS, INTER, LAYERS = 128, 4, 256, 2


def _config() -> ModelConfig:
    return ModelConfig(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                       num_attention_heads=HEADS, max_position_embeddings=512, num_audio_tokens=626,
                       num_text_tokens=50)


def _model(mode: str, seed: int = 0) -> ChatTTSLlama:
    """mode: a PackedLinear mode, or "int8_q8": int8 tiles times x's Q8 rows (kernels.int8_q8)."""
    if mode == "int8_q8":
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(kernels.INT8_SWITCH, "q8")
            model = _model("int8", seed)
        assert model.layers[0].mlp.down_packed.int8_q8
        return model
    gen = torch.Generator().manual_seed(seed)
    model = ChatTTSLlama(_config())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name or name == "norm.weight":
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    model = model.to(torch.bfloat16).eval()
    model.rotary_emb.float().reset_tables()
    model.pack_linears(mode)
    return model


def _prefilled(model: ChatTTSLlama, lens: list[int], kv_dtype: torch.dtype = torch.bfloat16):
    """KV pools holding `lens` random positions per sequence, and each sequence's block table."""
    kv = allocate_kv_pairs(LAYERS, 64, BLOCK, HEADS, HIDDEN // HEADS, kv_dtype)
    blocks = iter(range(64))
    tables = [[next(blocks) for _ in range(n // BLOCK + 1)] for n in lens]
    meta = build_attention_metadata(lens, lens, tables, BLOCK, "cpu")
    with torch.inference_mode():
        model(torch.randn(sum(lens), HIDDEN, generator=torch.Generator().manual_seed(2)), meta.positions, kv, meta)
    return kv, tables


def _decode_inputs(lens: list[int], tables: list[list[int]]):
    pos = torch.tensor(lens)
    slots = torch.tensor([t[p // BLOCK] * BLOCK + p % BLOCK for t, p in zip(tables, lens, strict=True)])
    width = max(map(len, tables))
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    return pos, DecodeMetadata(slots, padded, pos + 1)


@pytest.mark.parametrize("mode", ["bfloat16", "int8", "int8_q8", "int4"])
@pytest.mark.parametrize("lens", [[7], [5, 9, 2], [3, 11, 6, 1, 8, 4]])
def test_fused_decode_matches_the_layer_by_layer_path(isa: str, mode: str, lens: list[int]) -> None:
    model = _model(mode)
    kv, tables = _prefilled(model, lens)
    _check_fused_against_layer_by_layer(model, lens, kv, tables, mode)


@pytest.mark.parametrize("mode", ["bfloat16", "int8", "int8_q8"])
@pytest.mark.parametrize("lens", [[7], [3, 11, 6, 1, 8, 4]])
def test_fused_decode_over_int8_kv_matches_the_layer_by_layer_path(isa: str, mode: str, lens: list[int]) -> None:
    model = _model(mode)
    kv, tables = _prefilled(model, lens, torch.int8)
    _check_fused_against_layer_by_layer(model, lens, kv, tables, mode)


def _check_fused_against_layer_by_layer(model, lens, kv, tables, mode: str) -> None:
    kv_fused = [(k.clone(), v.clone()) for k, v in kv]
    x = torch.randn(len(lens), HIDDEN, generator=torch.Generator().manual_seed(3))
    pos, meta = _decode_inputs(lens, tables)
    with torch.inference_mode():
        expected = model(x, pos, kv, meta)
        fused = FusedDecoder(model)(x, pos, kv_fused, meta)
    scale = expected.abs().max().item()
    error = (fused - expected).abs() / scale
    # Both paths round q/K/V to bf16; fp32 sums in another order flip a rounding now and then (one ulp, 2^-8),
    # which moves that row's later outputs by ~1e-3. bf16 also rounds the SiLU gate once instead of twice.
    assert error.max().item() <= 1e-2
    int8_kv = kv[0][0].dtype == torch.int8
    # the new K/V rows were written where the Python path wrote them
    for pools, fused_pools in zip(kv, kv_fused, strict=True):
        for pool, fused_pool in zip(pools, fused_pools, strict=True):
            if int8_kv:  # rows quantised from fp32 values that differ in the last bits: one step apart at most,
                # two for int8 weights times Q8 rows (a bf16 step in a group's largest value changes the group's
                # scale, which moves the projection's output a little more)
                steps = 2 if mode == "int8_q8" else 1
                assert (pool[..., :-4].int() - fused_pool[..., :-4].int()).abs().max().item() <= steps
                pool, fused_pool = dequantize_kv(pool, torch.float32), dequantize_kv(fused_pool, torch.float32)
            assert (pool.float() - fused_pool.float()).abs().max().item() <= 2**-7 * pool.float().abs().max().item()


@pytest.mark.skipif(not {"amx_tile", "amx_bf16"} <= kernels.cpu_flags(),
                    reason="needs AMX-BF16: compares the AMX panels with the AVX-512 tiles of CPUs without AMX, which "
                           "every other test here already takes on this CPU")
@pytest.mark.parametrize("mode", ["bfloat16", "int8"])
def test_fused_decode_on_the_avx512_tiles_is_close_to_amx(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lens = [3, 11, 6, 1, 8, 4]
    x = torch.randn(len(lens), HIDDEN, generator=torch.Generator().manual_seed(4))
    outputs = []
    for switch in ("1", "noamx"):
        monkeypatch.setenv(kernels.ENV_SWITCH, switch)
        model = _model(mode)
        assert model.layers[0].mlp.down_packed.kernel == ("amx" if switch == "1" else "tiles")
        kv, tables = _prefilled(model, lens)
        pos, meta = _decode_inputs(lens, tables)
        with torch.inference_mode():
            outputs.append(FusedDecoder(model)(x, pos, kv, meta))
    with_amx, without = outputs
    assert (with_amx - without).abs().max().item() <= 1e-2 * with_amx.abs().max().item()


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_fused_decode_rows_do_not_depend_on_the_batch(isa: str, mode: str) -> None:
    model = _model(mode)
    lens = [5, 9, 2]
    kv, tables = _prefilled(model, lens)
    x = torch.randn(len(lens), HIDDEN)
    pos, meta = _decode_inputs(lens, tables)
    pos_alone, meta_alone = _decode_inputs(lens[1:2], tables[1:2])
    with torch.inference_mode():
        decoder = FusedDecoder(model)
        together = decoder(x, pos, [(k.clone(), v.clone()) for k, v in kv], meta)
        alone = decoder(x[1:2], pos_alone, kv, meta_alone)
    assert torch.equal(together[1:2], alone)


def test_fused_decode_rejects_slots_outside_the_pool() -> None:
    model = _model("bfloat16")
    kv, tables = _prefilled(model, [3])
    pos, meta = _decode_inputs([3], tables)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="slot_mapping"):
        FusedDecoder(model)(torch.randn(1, HIDDEN), pos, kv, meta._replace(slot_mapping=torch.tensor([10_000])))


def test_fused_decode_rejects_float32_pools_before_writing() -> None:
    model = _model("int8")
    kv, tables = _prefilled(model, [3])
    pools = [(k.float(), v.float()) for k, v in kv]
    before = [k.clone() for k, _ in pools]
    pos, meta = _decode_inputs([3], tables)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="bf16 pools"):
        FusedDecoder(model)(torch.randn(1, HIDDEN), pos, pools, meta)
    assert all(torch.equal(k, b) for (k, _), b in zip(pools, before, strict=True))


def test_fused_decoder_without_kernel_tiles_is_a_clear_error() -> None:
    model = _model("float32")
    assert "kernel layout" in fused_unavailable(model)
    with pytest.raises(ValueError, match="FusedDecoder: not every projection is in kernel layout"):
        FusedDecoder(model)


def _engine(mode: str, **options) -> LLMEngine:
    config = _config()
    embed = Embed(HIDDEN, config.num_audio_tokens, config.num_text_tokens, config.num_vq)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in embed.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    model = _model("float32")  # weights only: the engine packs them
    for layer in model.layers:
        layer.self_attn.qkv_packed = layer.self_attn.o_packed = None
        layer.mlp.gate_up_packed = layer.mlp.down_packed = None
    options = {"kv_cache_memory": 1 << 22, **options}
    engine_config = EngineConfig.from_kwargs(dtype=mode, block_size=BLOCK, **options)
    return LLMEngine(model, embed, config, engine_config)


def _prompt(i: int) -> Prompt:
    ids = torch.arange(1 + i, 6 + 2 * i)[:, None].repeat(1, 4)  # [T, 4] text ids
    return Prompt(ids, torch.ones(len(ids), dtype=torch.bool))


def _generate(engine: LLMEngine, n: int, steps: int = 12) -> list[torch.Tensor]:
    rows: dict[str, list[torch.Tensor]] = {}
    for i in range(n):
        params = SamplingParams(temperature=1e-6, max_new_token=steps, min_new_token=steps, seed=i)
        engine.add_request(f"r{i}", _prompt(i), params)
    while engine.has_unfinished_requests():
        for out in engine.step():
            rows.setdefault(out.request_id, []).append(out.token_ids)
    return [torch.cat(rows[f"r{i}"]) for i in range(n)]


@pytest.mark.parametrize("mode", ["bfloat16", "int8"])
def test_engine_decodes_with_fused_layers_and_compiles_nothing(mode: str) -> None:
    before = dict(counters["stats"])
    fused = _engine(mode, compile=True)  # auto: the cpu backend wherever these tests run
    assert fused.runner.backend.name == "cpu" and fused.metrics()["backend"] == "cpu"
    tokens = _generate(fused, 6)
    assert dict(counters["stats"]) == before  # no graph was compiled
    eager = _engine(mode, backend="torch")  # the layer-by-layer path over the same packed weights
    reference = _generate(eager, 6)
    same = sum(torch.equal(a, b) for a, b in zip(tokens, reference, strict=True))
    assert same >= 5  # a near-tie may flip once: both round q/K/V to bf16 after differently ordered sums


# the default precision in the default suite, the others (~6 s each on 2 quiet cores) in the slow suite
@pytest.mark.parametrize("mode", [pytest.param("bfloat16", marks=pytest.mark.slow), "int8",
                                  pytest.param("int4", marks=pytest.mark.slow)])
def test_fused_engine_recomputes_preempted_sequences(isa: str, mode: str) -> None:
    free = _generate(_engine(mode), 6, steps=30)
    # 16 blocks of 4 positions (2 layers x K/V x 4 x 128 bf16 = 4 KB each) cannot hold 6 sequences of ~40
    block_bytes = LAYERS * 2 * BLOCK * HIDDEN * 2
    tight = _engine(mode, kv_cache_memory=16 * block_bytes, max_model_len=64)
    constrained = _generate(tight, 6, steps=30)
    assert tight.scheduler.num_preemptions > 0 and tight.block_manager.num_used_blocks == 0
    # recomputed positions run the decode step's op and kernels row by row: the same bits, the same tokens
    assert all(torch.equal(a, b) for a, b in zip(free, constrained, strict=True))


def test_int8_kv_engine_decodes_fused_preempts_and_finishes() -> None:
    roomy = _engine("bfloat16", kv_cache_dtype="int8")
    assert roomy.runner.backend.name == "cpu" and roomy.runner.kv_cache[0][0].dtype == torch.int8
    bf16_blocks = _engine("bfloat16").block_manager.num_blocks
    assert roomy.block_manager.num_blocks == bf16_blocks * 2 * 32 // (32 + 4)  # head_dim 32: 36 bytes a row, not 64
    free = _generate(roomy, 6, steps=30)
    tight = _engine("bfloat16", kv_cache_dtype="int8", kv_cache_memory=16 * LAYERS * 2 * BLOCK * HEADS * 36,
                    max_model_len=64)
    constrained = _generate(tight, 6, steps=30)
    assert tight.scheduler.num_preemptions > 0 and tight.block_manager.num_used_blocks == 0
    # recompute quantises the same rows with the same code (the decode op, row by row): the same bytes and tokens
    assert all(torch.equal(a, b) for a, b in zip(free, constrained, strict=True))


@pytest.mark.parametrize("mode", ["bfloat16", pytest.param("int8", marks=pytest.mark.slow)])  # int8: slow suite
def test_int8_kv_codes_agree_with_bf16_kv_teacher_forced(mode: str) -> None:
    """Both engines score the bf16-KV engine's own greedy codes, position by position, through their decode steps."""
    reference, fast = _engine(mode), _engine(mode, kv_cache_dtype="int8")
    prompts, codes = [_prompt(i) for i in range(6)], _generate(reference, 6, steps=40)
    same = _forced_logits(reference, prompts, codes).argmax(-1) == _forced_logits(fast, prompts, codes).argmax(-1)
    agreement = same.float().mean().item()
    print(f"int8 KV vs bf16 KV ({mode} weights): {agreement:.2%} of codes agree")
    assert agreement >= 0.95


@torch.inference_mode()
def _forced_logits(engine: LLMEngine, prompts: list[Prompt], codes: list[torch.Tensor]) -> torch.Tensor:
    """Code logits [B * T, 4, V] of each generated position: the prompts prefilled, then `codes` fed by decode steps."""
    runner, steps = engine.runner, codes[0].shape[0]
    width = -(-(max(len(p) for p in prompts) + steps) // BLOCK)
    tables = [list(range(b * width, (b + 1) * width)) for b in range(len(prompts))]
    last = []
    for prompt, table in zip(prompts, tables, strict=True):
        meta = build_attention_metadata([len(prompt)], [len(prompt)], [table], BLOCK)
        last.append(forward(runner.backend, runner.embed.embed(prompt.input_ids, prompt.text_mask), meta)[-1])
    hidden = [torch.stack(last)]  # [B, H] per step
    for t in range(steps - 1):
        ids = torch.stack([c[t] for c in codes])  # [B, 4]
        embeds = runner.embed.embed(ids, torch.zeros(len(ids), dtype=torch.bool))
        positions = [len(p) + t for p in prompts]
        trimmed = [table[: q // BLOCK + 1] for table, q in zip(tables, positions, strict=True)]
        hidden.append(decode(runner.backend, embeds, positions, trimmed))
    return runner.embed.code_logits(torch.stack(hidden, 1).float().flatten(0, 1))
