"""Reduced-precision engines (bfloat16, int8): packed linears against float32 formulas, and code agreement.

Agreement is teacher-forced: both engines score the same fp32 trajectory position by position, so one
flipped near-tie cannot snowball into a different continuation (free-running sequences diverge after
their first different code, whatever the precision).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from backend_lists import decode, forward

from chattts_velocity import load_pretrained
from chattts_velocity.model import PackedLinear, build_attention_metadata, kernels
from chattts_velocity.params import InferCodeParams
from chattts_velocity.text import Tokenizer, sample_random_speaker

gen = torch.Generator().manual_seed(0)
WEIGHT = torch.randn(96, 64, generator=gen) * 0.05
X = torch.randn(5, 64, generator=gen)


def test_float32_packed_linear_is_f_linear_exactly() -> None:
    assert torch.equal(PackedLinear(WEIGHT, "float32")(X), F.linear(X, WEIGHT))


def test_bfloat16_packed_linear_is_within_bf16_rounding() -> None:
    y = PackedLinear(WEIGHT, "bfloat16")(X).float()
    exact = X.double() @ WEIGHT.double().T
    # inputs and weights rounded to bf16 (rel. 2^-8 each) and the output too: |err| <= 3 * 2^-8 * sum|x w|
    bound = 3 * 2**-8 * (X.double().abs() @ WEIGHT.double().abs().T)
    assert ((y.double() - exact).abs() <= bound + 1e-6).all()


def test_int8_packed_linear_is_within_quantisation_error() -> None:
    lin = PackedLinear(WEIGHT, "int8")
    scales = WEIGHT.abs().amax(dim=1) / 127  # [out]
    # half a step of rounding, plus the bf16 rounding of the stored scale (rel. 2^-8) times |q| <= 127
    per_weight = scales.double() * (0.5 + 127 * 2**-8)  # [out]
    dequantised = lin.dequantized().double()
    assert ((dequantised - WEIGHT.double()).abs() <= per_weight[:, None] + 1e-9).all()
    y = lin(X).double()
    exact = X.double() @ WEIGHT.double().T
    # plus the bf16 rounding of x and of the output
    bound = (X.double().abs().sum(1, keepdim=True) * per_weight
             + 3 * 2**-8 * (X.double().abs() @ WEIGHT.double().abs().T))
    assert ((y - exact).abs() <= bound + 1e-6).all()


def test_unknown_mode_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="mode"):
        PackedLinear(WEIGHT, "int3")


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_reduced_precision_engine_keeps_checkpoint_names_and_fp32_outputs(tiny_assets, dtype) -> None:
    fp32, fast = load_pretrained(tiny_assets, is_vllm=True), load_pretrained(tiny_assets, is_vllm=True, dtype=dtype)
    assert fast.engine.runner.model.state_dict().keys() == fp32.engine.runner.model.state_dict().keys()
    assert fast.engine.runner.kv_cache[0][0].dtype == torch.bfloat16
    tok = Tokenizer(tiny_assets / "asset" / "tokenizer")
    out = fast.generate([tok.code_prompt("Hello there.")], _params(6), progress=False)[0]
    assert out.token_ids.shape == (6, 4) and out.hidden.dtype == torch.float32 and out.hidden.shape == (6, 64)


def _params(steps: int):
    return InferCodeParams(temperature=1e-6, max_new_token=steps, min_new_token=steps,
                           show_tqdm=False).to_sampling_params("code", 625, return_hidden=True)


def teacher_forced_agreement(assets, dtype: str, num_seqs: int, steps: int, decode_steps: bool = False,
                             reference: str = "float32", **options) -> float:
    """Share of (position, codebook) argmaxes of `dtype` (with engine `options`) equal to the `reference` precision's
    along the reference's own trajectory.

    The trajectory is scored by one prefill per sequence, or (decode_steps) by the engine's decode path, one
    batched step per position (the fused C++ layers where they are in use).
    """
    tok = Tokenizer(assets / "asset" / "tokenizer")
    ref = load_pretrained(assets, is_vllm=True, dtype=reference)
    fast = load_pretrained(assets, is_vllm=True, dtype=dtype, **options)
    torch.manual_seed(0)
    speaker = sample_random_speaker(ref.config.hidden_size)
    prompts = [tok.code_prompt(f"Sentence number {i} for the agreement test.", speaker) for i in range(num_seqs)]
    outputs = ref.generate(prompts, _params(steps), progress=False)
    codes = [o.token_ids for o in outputs]
    score = _decoded_logits if decode_steps else _prefilled_logits
    pairs = zip(score(ref, prompts, codes), score(fast, prompts, codes), strict=True)
    same = [(a.argmax(-1) == b.argmax(-1)) for a, b in pairs]
    return torch.cat([s.flatten() for s in same]).float().mean().item()


@torch.inference_mode()
def _prefilled_logits(llm, prompts, codes: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per sequence, code logits [T, 4, V] predicting each generated position, from one prefill of prompt + codes."""
    runner, logits = llm.engine.runner, []
    for prompt, seq_codes in zip(prompts, codes, strict=True):
        num_blocks = -(-(len(prompt) + len(seq_codes)) // runner.block_size)
        hidden = _prefill(runner, prompt, seq_codes, list(range(num_blocks)))
        logits.append(runner.embed.code_logits(hidden[len(prompt) - 1 : -1]))
    return logits


@torch.inference_mode()
def _decoded_logits(llm, prompts, codes: list[torch.Tensor]) -> list[torch.Tensor]:
    """As _prefilled_logits, but every generated position goes through a batched decode step."""
    runner = llm.engine.runner
    steps = codes[0].shape[0]
    width = -(-(max(len(p) for p in prompts) + steps) // runner.block_size)
    tables = [list(range(b * width, (b + 1) * width)) for b in range(len(prompts))]
    last = [_prefill(runner, p, codes[0][:0], t)[-1] for p, t in zip(prompts, tables, strict=True)]
    hidden = [torch.stack(last)]  # [B, H] per step
    for t in range(steps - 1):
        ids = torch.stack([c[t] for c in codes])  # [B, 4]
        embeds = runner.embed.embed(ids, torch.zeros(len(ids), dtype=torch.bool)).to(runner.act_dtype)
        positions = [len(p) + t for p in prompts]
        trimmed = [table[: q // runner.block_size + 1] for table, q in zip(tables, positions, strict=True)]
        hidden.append(decode(runner.backend, embeds, positions, trimmed))
    logits = runner.embed.code_logits(torch.stack(hidden, 1).float().flatten(0, 1))  # [B * T, 4, V]
    return list(logits.view(len(prompts), steps, *logits.shape[1:]))


def _prefill(runner, prompt, codes: torch.Tensor, blocks: list[int]) -> torch.Tensor:
    """Hidden states [P + T, H] of prompt + codes, run as one prefill into `blocks`."""
    ids = torch.cat([prompt.input_ids, codes])  # [P + T, 4]
    mask = torch.cat([prompt.text_mask, torch.zeros(len(codes), dtype=torch.bool)])
    embeds = runner.embed.embed(ids, mask)
    embeds[list(prompt.spk_positions)] = prompt.spk_emb
    meta = build_attention_metadata([len(ids)], [len(ids)], [blocks], runner.block_size)
    return forward(runner.backend, embeds.to(runner.act_dtype), meta).float()


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("decode_steps", [False, True], ids=["prefill", "decode"])
def test_reduced_precision_codes_agree_with_float32_tiny(tiny_assets, dtype, decode_steps) -> None:
    assert teacher_forced_agreement(tiny_assets, dtype, num_seqs=8, steps=100, decode_steps=decode_steps) >= 0.95


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("decode_steps", [False, True], ids=["prefill", "decode"])
def test_reduced_precision_codes_agree_with_float32_full_size(full_assets, dtype, decode_steps) -> None:
    agreement = teacher_forced_agreement(full_assets, dtype, num_seqs=8, steps=100, decode_steps=decode_steps)
    print(f"{dtype}: {agreement:.2%} of codes agree with float32")
    assert agreement >= 0.95


@pytest.mark.slow
@pytest.mark.skipif(kernels.unsupported() is not None, reason="int8 KV runs on the cpu backend's C++ kernels only")
@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
@pytest.mark.parametrize("decode_steps", [False, True], ids=["prefill", "decode"])
def test_int8_kv_codes_agree_with_bf16_kv_full_size(full_assets, dtype, decode_steps) -> None:
    agreement = teacher_forced_agreement(full_assets, dtype, num_seqs=8, steps=100, decode_steps=decode_steps,
                                         reference=dtype, kv_cache_dtype="int8")
    print(f"{dtype} weights: {agreement:.2%} of codes with int8 KV agree with bf16 KV")
    assert agreement >= 0.95
