"""Both GPT stages behind the one GPTBackend interface: the same calls, the same outputs, no kind checks."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity import Chat, InferCodeParams
from chattts_velocity.engine.gpt import GPTBackend
from chattts_velocity.text import split_pieces

TEXTS = ["Hello there.", "A second and somewhat longer text to say."]


@pytest.fixture(scope="module")
def chat(tiny_assets) -> Chat:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False)
    return chat


def near_greedy(steps: int) -> InferCodeParams:
    return InferCodeParams(temperature=1e-6, max_new_token=steps, min_new_token=steps, show_tqdm=False)


def requests(chat: Chat, params):
    return chat.speech_requests(split_pieces(TEXTS, split=False), params)


@pytest.mark.parametrize("use_vllm", [False, True])
def test_every_backend_has_the_whole_interface(chat: Chat, use_vllm: bool) -> None:
    gpt = chat.gpt(use_vllm)
    for name in ("generate", "generate_iter", "stream", "shutdown"):
        assert callable(getattr(gpt, name)), name
    assert gpt.config.hidden_size == chat.config.hidden_size
    assert set(dir(GPTBackend)) & {"generate", "generate_iter", "stream", "shutdown"} <= set(dir(gpt))


@pytest.mark.parametrize("use_vllm", [False, True])
def test_stream_and_generate_iter_rebuild_generate(chat: Chat, use_vllm: bool) -> None:
    gpt, req = chat.gpt(use_vllm), requests(chat, near_greedy(10))
    whole = gpt.generate(req.prompts, req.sampling, False)
    by_index = dict(gpt.generate_iter(req.prompts, req.sampling, False))
    rows: dict[int, list[torch.Tensor]] = {0: [], 1: []}
    finished = set()
    for deltas in gpt.stream(req.prompts, req.sampling, 4):
        for k, delta in deltas:
            assert len(delta.token_ids) <= 4 and k not in finished
            rows[k].append(delta.token_ids)
            if delta.finished:
                finished.add(k)
    assert finished == {0, 1}
    for k, out in enumerate(whole):
        assert len(out.token_ids) == 10
        assert torch.equal(by_index[k].token_ids, out.token_ids)
        assert torch.equal(torch.cat(rows[k]), out.token_ids)


def test_the_two_backends_agree_through_the_interface(chat: Chat) -> None:
    req = requests(chat, near_greedy(12))
    plain, fast = (chat.gpt(v).generate(req.prompts, req.sampling, False) for v in (False, True))
    for a, b in zip(plain, fast, strict=True):
        assert torch.equal(a.token_ids, b.token_ids)
        assert (a.hidden - b.hidden).abs().max().item() <= 1e-4


@pytest.mark.parametrize("use_vllm", [False, True])
def test_both_backends_refuse_a_prompt_that_cannot_fit_by_the_one_rule(chat: Chat, use_vllm: bool) -> None:
    """schema.check_prompt_fits on either path: the same ValueError naming max_new_token, before any step."""
    req = requests(chat, near_greedy(chat.config.max_position_embeddings))
    limit = "max_model_len" if use_vllm else "max_position_embeddings"
    with pytest.raises(ValueError, match=rf"^max_new_token: the prompt \(\d+ positions\) \+ max_new_token \(\d+\) = "
                                         rf"\d+ exceeds {limit} \(\d+\); lower max_new_token"):
        chat.gpt(use_vllm).generate(req.prompts, req.sampling, False)


def test_speech_requests_one_per_piece_with_its_texts_params(chat: Chat) -> None:
    pieces = chat.split(["One. Two.", "Three."])
    params = [InferCodeParams(manual_seed=1), InferCodeParams(manual_seed=2)]
    req = chat.speech_requests(pieces, params)
    assert pieces.owner == [0, 0, 1] and len(req.prompts) == len(req.sampling) == 3
    assert [s.seed for s in req.sampling] == [1, 1, 2]
    assert all(s.eos_token_id == chat.config.audio_eos_id for s in req.sampling)


def test_speech_requests_reject_bad_input(chat: Chat) -> None:
    pieces = chat.split(["One.", "Two."])
    with pytest.raises(ValueError, match="params: got 1 InferCodeParams for 2 texts"):
        chat.speech_requests(pieces, [InferCodeParams()])
    with pytest.raises(ValueError, match="spk_emb: this speaker has 3 values"):
        chat.speech_requests(pieces, InferCodeParams(spk_emb=torch.zeros(3)))
    with pytest.raises(ValueError, match=r"text\[1\]: is empty"):
        chat.split(["fine", "  "])
