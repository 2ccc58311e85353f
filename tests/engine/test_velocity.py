"""The velocity engine on real (random-weight) checkpoints: equals the plain path, seeds, preemption, abort."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity import Chat, InferCodeParams, RefineTextParams, load_pretrained
from chattts_velocity.engine.llm import LLM
from chattts_velocity.text import split_pieces

TEXTS = ["Hello world.", "你好，今天天气很好，我们出去玩吧。", "Short", "A somewhat longer English sentence here."]


def _chat(assets) -> Chat:
    chat = Chat()
    chat.load(source="custom", custom_path=assets, verify=False)
    return chat


@pytest.fixture(scope="module")
def chat(tiny_assets) -> Chat:
    return _chat(tiny_assets)


def _code_outputs(chat: Chat, use_vllm: bool, params: InferCodeParams, texts=TEXTS):
    requests = chat.speech_requests(split_pieces(list(texts), split=False), params)  # texts as they are
    return chat.gpt(use_vllm).generate(requests.prompts, requests.sampling, False, max_batch=len(texts))


def _assert_same(plain, fast, hidden_tol: float) -> None:
    for a, b in zip(plain, fast, strict=True):
        assert torch.equal(a.token_ids, b.token_ids)
        assert a.finish_reason == b.finish_reason
        assert (a.hidden - b.hidden).abs().max().item() <= hidden_tol


def near_greedy(**kw) -> InferCodeParams:
    return InferCodeParams(temperature=1e-6, show_tqdm=False, **kw)


def test_code_phase_equals_plain_path_mixed_lengths_with_speaker(chat: Chat) -> None:
    torch.manual_seed(0)
    params = near_greedy(spk_emb=chat.sample_random_speaker(), max_new_token=48)
    _assert_same(_code_outputs(chat, False, params), _code_outputs(chat, True, params), 1e-4)


def test_code_phase_equals_plain_path_without_speaker_forced_length(chat: Chat) -> None:
    params = near_greedy(max_new_token=24, min_new_token=24)
    plain, fast = _code_outputs(chat, False, params), _code_outputs(chat, True, params)
    assert all(len(o.token_ids) == 24 for o in fast)
    _assert_same(plain, fast, 1e-4)


def test_audio_prompt_speaker_equals_plain_path(chat: Chat) -> None:
    clip = chat.infer(["Hello."], skip_refine_text=True, use_vllm=False,
                      params_infer_code=near_greedy(max_new_token=20, min_new_token=20))[0]
    params = near_greedy(spk_smp=chat.sample_audio_speaker(clip), txt_smp="Hello.", max_new_token=24)
    plain, fast = _code_outputs(chat, False, params), _code_outputs(chat, True, params)
    _assert_same(plain, fast, 1e-4)


def test_refine_ids_equal_plain_path(chat: Chat) -> None:
    params = RefineTextParams(temperature=1e-6, max_new_token=20, show_tqdm=False)
    plain, fast = (chat.infer(TEXTS, refine_text_only=True, split_text=False, params_refine_text=params,
                              max_split_batch=len(TEXTS), use_vllm=use_vllm) for use_vllm in (False, True))
    assert plain == fast


def test_infer_use_vllm_gives_one_waveform_per_text(chat: Chat) -> None:
    params = InferCodeParams(max_new_token=10, min_new_token=10, manual_seed=1, show_tqdm=False)
    wavs = chat.infer(TEXTS, skip_refine_text=True, params_infer_code=params, use_vllm=True)
    assert [len(w) for w in wavs] == [(2 * 10 - 1) * 256] * len(TEXTS)


def _fresh_llm(assets, **engine_kwargs) -> LLM:
    return load_pretrained(assets, is_vllm=True, **engine_kwargs)


def _prompts(chat: Chat, texts):
    return [chat.tokenizer.code_prompt(t, None, None, "[speed_5]", None) for t in texts]


def _seeded(seed: int, steps: int = 16):
    return InferCodeParams(manual_seed=seed, max_new_token=steps, show_tqdm=False).to_sampling_params(
        "code", 625, return_hidden=True)


def test_same_seed_same_codes_alone_in_batch_of_16_and_reordered(chat: Chat, tiny_assets) -> None:
    llm = _fresh_llm(tiny_assets)
    target = _prompts(chat, ["The request we follow."])[0]
    alone = llm.generate([target], [_seeded(42)], progress=False)[0]
    others = _prompts(chat, [f"Other text number {i}." for i in range(15)])
    batch = llm.generate([target] + others, [_seeded(42)] + [_seeded(i) for i in range(15)], progress=False)
    reordered = llm.generate(others[:7] + [target] + others[7:],
                             [_seeded(i) for i in range(7)] + [_seeded(42)] + [_seeded(i) for i in range(7, 15)],
                             progress=False)
    assert torch.equal(alone.token_ids, batch[0].token_ids)
    assert torch.equal(alone.token_ids, reordered[7].token_ids)
    assert len(alone.token_ids) > 0


def test_preemption_gives_identical_outputs(chat: Chat, tiny_assets) -> None:
    texts = [f"Sentence number {i} with a few words." for i in range(6)]
    prompts = _prompts(chat, texts)
    params = [_seeded(i, steps=40) for i in range(6)]
    free = _fresh_llm(tiny_assets).generate(prompts, params, progress=False)
    # A pool of 24 blocks of 4 positions cannot hold 6 sequences of ~60 positions: forces preemption.
    tight = _fresh_llm(tiny_assets, block_size=4, kv_cache_memory=_kv_bytes(tiny_assets, 24, 4),
                       max_model_len=96)
    constrained = tight.generate(prompts, params, progress=False)
    for a, b in zip(free, constrained, strict=True):
        assert torch.equal(a.token_ids, b.token_ids)
        assert (a.hidden - b.hidden).abs().max().item() <= 1e-5
    assert tight.engine.block_manager.num_used_blocks == 0
    assert _preempted(tight)


def _preempted(llm: LLM) -> bool:
    preemptions = llm.engine.metrics()["num_preemptions"]
    assert preemptions == llm.engine.scheduler.num_preemptions
    return preemptions > 0


def _kv_bytes(assets, num_blocks: int, block_size: int) -> int:
    from chattts_velocity.config import ModelConfig
    from chattts_velocity.model import kv_cache_bytes_per_block

    cfg = ModelConfig.from_json(f"{assets}/asset/gpt/config.json")
    per = kv_cache_bytes_per_block(cfg.num_hidden_layers, block_size, cfg.num_attention_heads, cfg.head_dim,
                                   torch.float32)
    return num_blocks * per


def test_abort_frees_every_block(chat: Chat, tiny_assets) -> None:
    llm = _fresh_llm(tiny_assets)
    engine = llm.engine
    ids = [engine.add_request(None, p, _seeded(i, steps=50)) for i, p in enumerate(_prompts(chat, TEXTS))]
    for _ in range(3):
        engine.step()
    assert engine.block_manager.num_used_blocks > 0
    for rid in ids:
        assert engine.abort_request(rid)
    assert engine.block_manager.num_used_blocks == 0
    assert not engine.has_unfinished_requests()


def test_kv_budget_too_small_is_a_clear_error(tiny_assets) -> None:
    with pytest.raises(ValueError, match="kv_cache_memory"):
        _fresh_llm(tiny_assets, kv_cache_memory=1024)


@pytest.mark.slow
def test_full_size_equals_plain_path(full_assets) -> None:
    chat = _chat(full_assets)
    params = near_greedy(spk_emb=chat.sample_random_speaker(), max_new_token=12, min_new_token=12)
    texts = TEXTS[:3]
    _assert_same(_code_outputs(chat, False, params, texts), _code_outputs(chat, True, params, texts), 1e-4)
