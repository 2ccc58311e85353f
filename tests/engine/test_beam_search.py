"""Beam search for the text pass on tiny random weights: greedy at width 1, exhaustive = brute force, both GPT
paths agree, blocks are shared while searching and all freed at the end or on abort, beams refused on codes."""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools

import pytest
import torch

from chattts_velocity import Chat, InferCodeParams, RefineTextParams, load_pretrained
from chattts_velocity.engine.async_engine import AsyncLLMEngine
from chattts_velocity.engine.plain.beams import plain_beam_search
from chattts_velocity.schema import SamplingParams

TEXTS = ["Hello world, this is a longer refine prompt.", "你好，今天天气很好，我们出去玩吧。"]


@pytest.fixture(scope="module")
def chat(tiny_assets) -> Chat:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False)
    return chat


@pytest.fixture(scope="module")
def prompts(chat: Chat):
    return [chat.tokenizer.refine_prompt(t) for t in TEXTS]


def text_params(chat: Chat, **kw) -> SamplingParams:
    values = dict(mode="text", eos_token_id=chat.tokenizer.eos_id, return_hidden=False, temperature=0.7,
                  top_p=0.7, top_k=20, repetition_penalty=1.05, max_new_token=10, ensure_non_empty=False)
    return SamplingParams(**{**values, **kw})


def engine_beams(chat: Chat, prompts, params: SamplingParams) -> list:
    """Run beam requests to the end by stepping the engine (any width, 1 included); outputs in prompt order."""
    engine = chat.engine()
    ids = [engine.beams.add(f"beam-test-{k}", p, params) for k, p in enumerate(prompts)]
    outputs = {}
    while len(outputs) < len(ids):
        outputs.update((d.request_id, d) for d in engine.step() if d.finished)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return [outputs[rid] for rid in ids]


def test_width_one_is_greedy_decoding_on_both_paths(chat: Chat, prompts) -> None:
    beam = text_params(chat, beam_width=1, min_new_token=3)
    greedy = text_params(chat, temperature=1e-6, seed=0, min_new_token=3)
    plain = chat.gpt(False)
    cases = [
        ([plain.generate([p], greedy, False)[0] for p in prompts],
         [plain_beam_search(plain, p, beam) for p in prompts]),
        (chat.gpt(True).generate(prompts, greedy, False), engine_beams(chat, prompts, beam)),
    ]
    for sampled, searched in cases:
        for a, b in zip(sampled, searched, strict=True):
            assert len(a.token_ids) >= 3
            assert torch.equal(a.token_ids, b.token_ids) and a.finish_reason == b.finish_reason


def restrict_to(allowed: list[int]):
    """A custom logits processor that leaves only `allowed` token ids."""
    keep = torch.tensor(allowed)

    def processor(history: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        masked = torch.full_like(logits, float("-inf"))
        masked[:, keep] = logits[:, keep]
        return masked

    return processor


def brute_force(chat: Chat, prompt, params: SamplingParams, allowed: list[int]) -> dict[tuple[int, ...], float]:
    """Every hypothesis (tokens, EOS excluded) -> its length-normalised score, scored by full forwards."""
    gpt, eos, n = chat.gpt(False), params.eos_token_id, params.max_new_token
    words = [t for t in allowed if t != eos]

    @functools.cache
    def logprobs(tokens: tuple[int, ...]) -> torch.Tensor:  # [V] of the token after `tokens`
        rows = torch.cat([prompt.input_ids, torch.tensor(tokens, dtype=torch.int64).view(-1, 1).expand(-1, 4)])
        mask = torch.cat([prompt.text_mask, torch.ones(len(tokens), dtype=torch.bool)])
        embeds = gpt.embed.embed(rows.unsqueeze(0), mask.unsqueeze(0))
        with torch.inference_mode():
            hidden = gpt.llama(inputs_embeds=embeds, position_ids=torch.arange(len(rows)).unsqueeze(0))
        logits = gpt.embed.text_logits(hidden.last_hidden_state[:, -1]).float()[0]
        restricted = torch.full_like(logits, float("-inf"))
        restricted[allowed] = logits[allowed]
        return restricted.log_softmax(-1)

    scores = {}
    for length in range(n + 1):
        for tokens in itertools.product(words, repeat=length):
            ended = length < n  # shorter hypotheses end with EOS; full-length ones by length
            total = sum(logprobs(tokens[:i])[t].item() for i, t in enumerate(tokens))
            total += logprobs(tokens)[eos].item() if ended else 0.0
            scores[tokens] = total / (length + ended) ** params.length_penalty
    return scores


@pytest.mark.parametrize("length_penalty", [1.0, pytest.param(0.0, marks=pytest.mark.slow)])  # the second: slow suite
def test_exhaustive_beams_find_the_brute_force_best_on_both_paths(chat: Chat, prompts, length_penalty) -> None:
    eos = chat.tokenizer.eos_id
    allowed = [eos, 1000, 5000, 9000]  # 3 words + EOS, 3 steps: 40 hypotheses, 4**3 = 64 beams is exhaustive
    params = text_params(chat, beam_width=64, max_new_token=3, repetition_penalty=1.0, length_penalty=length_penalty,
                         logits_processors=(restrict_to(allowed),))
    for prompt in prompts:
        scores = brute_force(chat, prompt, params, allowed)
        best = max(scores, key=scores.get)
        greedy = plain_beam_search(chat.gpt(False), prompt, dataclasses.replace(params, beam_width=1))
        plain = plain_beam_search(chat.gpt(False), prompt, params)
        fast = engine_beams(chat, [prompt], params)[0]
        assert tuple(plain.token_ids[:, 0].tolist()) == best
        assert torch.equal(plain.token_ids, fast.token_ids) and plain.finish_reason == fast.finish_reason
        assert plain.extra["beam_score"] == pytest.approx(scores[best], abs=1e-4)
        assert scores[best] >= scores[tuple(greedy.token_ids[:, 0].tolist())] - 1e-6


def test_refine_with_beams_is_the_same_text_on_both_paths(chat: Chat) -> None:
    params = RefineTextParams(beam_width=3, max_new_token=12, show_tqdm=False, repetition_penalty=1.1)
    plain = chat.infer(TEXTS, refine_text_only=True, params_refine_text=params, use_vllm=False)
    fast = chat.infer(TEXTS, refine_text_only=True, params_refine_text=params, use_vllm=True)
    assert plain == fast and all(plain)  # deterministic without a seed; never empty (ensure_non_empty)


def test_beams_share_prompt_blocks_and_free_them_on_abort(chat: Chat, prompts) -> None:
    engine = chat.engine()
    manager = engine.block_manager
    params = text_params(chat, beam_width=4, max_new_token=40, min_new_token=40)
    engine.beams.add("to-abort", prompts[0], params)
    shared = False
    for _ in range(6):
        engine.step()
        shared |= max(manager.ref_counts) > 1
    assert len(engine.beams.groups["to-abort"].seqs) == 4
    assert shared  # the beams hold the prompt's full blocks once
    assert manager.num_free_blocks < manager.num_blocks
    assert engine.abort_request("to-abort")
    assert manager.num_free_blocks == manager.num_blocks
    assert not engine.has_unfinished_requests() and not engine.beams.groups


@pytest.mark.slow  # the heaviest default test (~9 s of the suite on 2 quiet cores)
def test_a_small_pool_preempts_beams_and_gets_the_same_result(chat: Chat, tiny_assets, prompts) -> None:
    params = text_params(chat, beam_width=4, max_new_token=24, min_new_token=20, repetition_penalty=1.1, priority=1)
    expected = [plain_beam_search(chat.gpt(False), p, params) for p in prompts]
    # a request of higher priority (2 blocks, growing to 4) runs beside beam requests that reserve 9 of 11 blocks:
    # when it grows, the beams (lowest priority) are preempted and recomputed
    sampled = text_params(chat, seed=3, max_new_token=40, min_new_token=40, priority=0)
    alone = chat.gpt(True).generate([prompts[0]], sampled, progress=False)[0]
    llm = load_pretrained(tiny_assets, is_vllm=True, max_model_len=64, kv_cache_memory=11 * 16 * 1024,
                          scheduling="priority")
    manager = llm.engine.block_manager
    assert manager.num_blocks == 11  # 2 layers x K,V x 16 positions x 4 heads x 16 dims x 4 bytes per block
    outputs = llm.generate([*prompts, prompts[0]], [params, params, sampled], progress=False)
    assert llm.engine.scheduler.num_preemptions > 0
    for a, b in zip(expected, outputs, strict=False):
        assert torch.equal(a.token_ids, b.token_ids) and a.finish_reason == b.finish_reason
    assert torch.equal(outputs[2].token_ids, alone.token_ids)
    assert manager.num_free_blocks == manager.num_blocks


def test_beams_leave_sampled_requests_in_the_same_batch_unchanged(chat: Chat, prompts) -> None:
    llm = chat.gpt(True)
    sampled = text_params(chat, seed=7, max_new_token=12)
    alone = llm.generate([prompts[1]], sampled, progress=False)[0]
    both = llm.generate(prompts, [text_params(chat, beam_width=3, max_new_token=12), sampled], progress=False)
    assert torch.equal(both[1].token_ids, alone.token_ids)


def test_async_engine_serves_a_beam_request(chat: Chat, tiny_assets, prompts) -> None:
    params = text_params(chat, beam_width=3, max_new_token=12)
    expected = chat.gpt(True).generate([prompts[0]], params, progress=False)[0]
    engine = AsyncLLMEngine(load_pretrained(tiny_assets, is_vllm=True).engine)

    async def run() -> list:
        return [delta async for delta in engine.generate(prompts[0], params)]

    try:
        deltas = asyncio.run(run())
    finally:
        engine.shutdown()
    assert len(deltas) == 1 and deltas[0].finished
    assert torch.equal(deltas[0].token_ids, expected.token_ids)


def test_async_abort_of_a_beam_request_frees_every_block(chat: Chat, tiny_assets, prompts) -> None:
    params = text_params(chat, beam_width=4, max_new_token=60, min_new_token=60)
    engine = AsyncLLMEngine(load_pretrained(tiny_assets, is_vllm=True).engine)
    inner = engine.engine

    async def run() -> list:
        stream = await engine.add_request(prompts[0], params)
        while sum(len(g.seqs) for g in list(inner.beams.groups.values())) < 4:
            await asyncio.sleep(0.01)
        engine.abort(stream.request_id)
        return [delta async for delta in engine.outputs(stream)]

    try:
        deltas = asyncio.run(run())
    finally:
        engine.shutdown()
    assert [d.finish_reason for d in deltas] == ["abort"]
    assert inner.block_manager.num_used_blocks == 0 and not inner.has_unfinished_requests()
    assert not inner.beams.groups


def test_a_failing_processor_fails_its_beam_request_only(chat: Chat, prompts) -> None:
    def fails_at_the_third_step(history: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        if len(history) == 2:
            raise RuntimeError("boom")
        return logits

    llm = chat.gpt(True)
    beams = text_params(chat, beam_width=3, min_new_token=5, logits_processors=(fails_at_the_third_step,))
    sampled = text_params(chat, seed=3)
    outputs = dict(llm.generate_iter(prompts, [beams, sampled], progress=False))
    assert "boom" in str(outputs[0].error) and outputs[0].finish_reason == "error"
    assert outputs[1].error is None and torch.equal(outputs[1].token_ids,
                                                    llm.generate([prompts[1]], sampled, False)[0].token_ids)
    assert llm.engine.block_manager.num_used_blocks == 0 and not llm.engine.beams.groups


@pytest.mark.parametrize("make", [
    lambda: InferCodeParams(beam_width=2),
    lambda: SamplingParams(mode="code", beam_width=2),
    lambda: SamplingParams(mode="text", beam_width=2),  # return_hidden defaults to True
    lambda: RefineTextParams(beam_width=0),
    lambda: RefineTextParams(beam_width=2.0),
    lambda: RefineTextParams(beam_width=True),
    lambda: SamplingParams(mode="text", beam_width=2, return_hidden=False, length_penalty=float("nan")),
])
def test_bad_beam_settings_are_a_value_error_naming_the_field(make) -> None:
    with pytest.raises(ValueError, match="beam_width|length_penalty"):
        make()
