"""Beam requests hold a seat of max_num_seqs for every beam and reserve the KV blocks their beams can hold: they wait
for seats and blocks instead of overflowing the running set or preempting others, one that can never fit the pool is
refused when added, and a fault in one request's search (its fork) fails that request only (tiny random weights)."""
from __future__ import annotations

import pytest
import torch
from fakes import make_prompt

from chattts_velocity import Chat, RefineTextParams, load_pretrained
from chattts_velocity.engine.beams.velocity import BeamSearch
from chattts_velocity.schema import SamplingParams

TEXTS = ["Hello world, this is a longer refine prompt.", "你好，今天天气很好，我们出去玩吧。", "One two three."]


@pytest.fixture(scope="module")
def chat(tiny_assets) -> Chat:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True)
    return chat


def text_params(chat: Chat, **kw) -> SamplingParams:
    values = dict(mode="text", eos_token_id=chat.tokenizer.eos_id, return_hidden=False, temperature=0.7,
                  top_p=0.7, top_k=20, repetition_penalty=1.05, max_new_token=10, ensure_non_empty=False)
    return SamplingParams(**{**values, **kw})


def run_to_end(engine, requests: list[tuple[str, object, SamplingParams]], max_running: int) -> dict:
    """Add the requests, step to the end checking the running set each step -> {request id: final output}."""
    for request_id, prompt, params in requests:
        engine.add_request(request_id, prompt, params)
    outputs: dict = {}
    while engine.has_unfinished_requests():
        outputs.update((d.request_id, d) for d in engine.step() if d.finished)
        assert len(engine.scheduler.running) <= max_running
    pool = engine.block_manager
    assert pool.num_used_blocks == 0 and pool.num_unreserved_blocks == pool.num_blocks
    return outputs


def tight_engine(tiny_assets):
    """20 KV blocks of 4 positions (4 KiB each in float32 on the tiny model)."""
    engine = load_pretrained(tiny_assets, is_vllm=True, block_size=4, max_model_len=64,
                             kv_cache_memory=20 * 4096).engine
    assert engine.block_manager.num_blocks == 20
    return engine


def tight_requests(chat: Chat) -> list[tuple[str, object, SamplingParams]]:
    """A beam request first (4 beams of 16 + 8 positions reserve 4 + 4 x 2 = 12 blocks), then five ordinary ones of 3
    blocks each that never grow (9 + 4 positions, the last never computed): 27 blocks in all, for a pool of 20."""
    beams = text_params(chat, beam_width=4, min_new_token=8, max_new_token=8)
    requests = [("beam", make_prompt(16, seed=100), beams)]
    return requests + [(f"plain-{k}", make_prompt(9, seed=k), text_params(chat, seed=k, max_new_token=4))
                       for k in range(5)]


def test_beam_requests_wait_for_seats_and_give_what_they_give_alone(chat: Chat, tiny_assets) -> None:
    prompts = [chat.tokenizer.refine_prompt(t) for t in TEXTS]
    beams = text_params(chat, beam_width=3, min_new_token=4, max_new_token=6)
    sampled = text_params(chat, seed=11, max_new_token=6)
    requests = [(f"beam-{k}", prompts[k % 3], beams) for k in range(4)]
    requests += [(f"sampled-{k}", prompts[k % 3], sampled) for k in range(2)]
    alone = {rid: run_to_end(chat.engine(), [(rid, p, params)], 64)[rid] for rid, p, params in requests}
    small = load_pretrained(tiny_assets, is_vllm=True, max_num_seqs=5).engine
    together = run_to_end(small, requests, max_running=5)
    for rid, output in alone.items():
        assert together[rid].error is None, together[rid].error
        assert torch.equal(together[rid].token_ids, output.token_ids), rid


def test_a_beam_width_over_max_num_seqs_is_refused_when_added(chat: Chat, tiny_assets) -> None:
    small = load_pretrained(tiny_assets, is_vllm=True, max_num_seqs=4).engine
    with pytest.raises(ValueError, match="beam_width: 5 beams .* max_num_seqs \\(4\\)"):
        small.add_request("wide", chat.tokenizer.refine_prompt(TEXTS[0]), text_params(chat, beam_width=5))
    assert not small.has_unfinished_requests() and not small.beams.groups


def test_a_beam_request_reserves_its_blocks_and_preempts_no_one_in_a_tight_pool(chat: Chat, tiny_assets) -> None:
    engine = tight_engine(tiny_assets)
    requests = tight_requests(chat)
    alone = {rid: run_to_end(engine, [(rid, p, params)], 64)[rid] for rid, p, params in requests}
    assert engine.scheduler.num_preemptions == 0
    together = run_to_end(engine, requests, 64)
    assert engine.scheduler.num_preemptions == 0  # its forks took reserved blocks: ordinary requests waited instead
    for rid, output in alone.items():
        assert together[rid].error is None, together[rid].error
        assert torch.equal(together[rid].token_ids, output.token_ids), rid


def test_a_beam_request_that_can_never_fit_the_pool_is_refused_alone(chat: Chat, tiny_assets) -> None:
    engine = tight_engine(tiny_assets)
    wide = text_params(chat, beam_width=8, max_new_token=16)  # 4 + 8 x 4 blocks
    with pytest.raises(ValueError, match="beam_width: 8 beams .* reserve 36 KV blocks but the pool has 20"):
        engine.add_request("wide", make_prompt(16, seed=100), wide)
    assert not engine.has_unfinished_requests() and not engine.beams.groups
    rid, prompt, params = tight_requests(chat)[1]
    assert run_to_end(engine, [(rid, prompt, params)], 64)[rid].error is None


@pytest.mark.parametrize("pool", ["roomy", "tight"])
def test_a_fork_that_fails_fails_its_request_only(chat: Chat, tiny_assets, pool: str, monkeypatch) -> None:
    prompts = [chat.tokenizer.refine_prompt(t) for t in TEXTS]
    beams = text_params(chat, beam_width=3, min_new_token=4, max_new_token=6)
    requests = [("good-0", prompts[0], beams), ("bad", prompts[1], beams), ("good-1", prompts[2], beams),
                ("sampled", prompts[1], text_params(chat, seed=5))]
    engine = chat.engine()
    if pool == "tight":
        engine = tight_engine(tiny_assets)
        requests = [(f"good-{k}" if rid != "beam" else "bad", p, params)
                    for k, (rid, p, params) in enumerate(tight_requests(chat))]
    alone = {rid: run_to_end(engine, [(rid, p, params)], 64)[rid] for rid, p, params in requests if rid != "bad"}
    fork = BeamSearch._fork

    def failing_fork(self, group, parent, tokens):
        if group.request_id == "bad":
            raise RuntimeError("fork refused")
        return fork(self, group, parent, tokens)

    monkeypatch.setattr(BeamSearch, "_fork", failing_fork)
    together = run_to_end(engine, requests, 64)
    assert "fork refused" in str(together["bad"].error) and together["bad"].finish_reason == "error"
    for rid, output in alone.items():
        assert together[rid].error is None and torch.equal(together[rid].token_ids, output.token_ids), rid
    assert not engine.beams.groups and not engine.scheduler.running


@pytest.mark.slow
def test_64_texts_with_8_beams_each_refine_in_one_call(chat: Chat) -> None:
    texts = [f"Sentence number {k} is here to be refined." for k in range(64)]
    params = RefineTextParams(beam_width=8, max_new_token=8, show_tqdm=False)
    refined = chat.infer(texts, refine_text_only=True, params_refine_text=params)
    assert len(refined) == 64 and all(isinstance(t, str) for t in refined)
    assert chat.engine().block_manager.num_used_blocks == 0
