"""Chat.infer(stream=True) on tiny random weights: real incremental chunks that concatenate to the non-stream clip."""
from __future__ import annotations

import numpy as np
import pytest

from chattts_velocity import Chat, InferCodeParams

TOL = 1e-5  # StreamDecoder's documented tolerance against the whole-clip decode
STEPS = 60
TEXTS = ["Hello world. And a second sentence here.", "Another text.", "第三个文本。"]


@pytest.fixture(scope="module")
def chat(tiny_assets) -> Chat:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True)
    return chat


def forced(seed: int = 3, **kw) -> InferCodeParams:
    return InferCodeParams(manual_seed=seed, max_new_token=STEPS, min_new_token=STEPS, show_tqdm=False,
                           stream_batch=8, **kw)


def joined(chunks: list[list[np.ndarray]], num_texts: int) -> list[np.ndarray]:
    return [np.concatenate([y[i] for y in chunks]) for i in range(num_texts)]


@pytest.mark.parametrize("use_vllm,use_decoder", [(True, True), (True, False), (False, True)])
def test_stream_chunks_concatenate_to_the_non_stream_waveform(chat: Chat, use_vllm: bool, use_decoder: bool) -> None:
    kw = dict(skip_refine_text=True, params_infer_code=forced(), use_vllm=use_vllm, use_decoder=use_decoder)
    whole = chat.infer(TEXTS, **kw)
    chunks = list(chat.infer(TEXTS, stream=True, **kw))
    for y in chunks:
        assert len(y) == len(TEXTS) and all(c.dtype == np.float32 and c.ndim == 1 for c in y)
        assert any(len(c) for c in y)
    for got, ref in zip(joined(chunks, len(TEXTS)), whole, strict=True):
        assert len(got) == len(ref)
        np.testing.assert_allclose(got, ref, rtol=0, atol=TOL)
        assert np.abs(ref).max() > 1e-3
    per_text = [sum(len(y[i]) > 0 for y in chunks) for i in range(len(TEXTS))]
    assert min(per_text) >= 3  # several chunks per text, not one clip at the end


def test_first_chunk_arrives_while_the_engine_is_still_generating(chat: Chat) -> None:
    engine = chat.engine()
    start = engine.stats.num_tokens_sampled
    stream = chat.infer(["One short text to stream."], stream=True, skip_refine_text=True,
                        params_infer_code=forced(seed=5))
    first = next(stream)
    at_first = engine.stats.num_tokens_sampled - start
    rest = list(stream)
    total = engine.stats.num_tokens_sampled - start
    assert total == STEPS and at_first < STEPS / 2
    assert 0 < len(first[0]) < sum(len(y[0]) for y in [first, *rest]) / 2


def test_closing_the_stream_early_aborts_and_frees_blocks(chat: Chat) -> None:
    engine = chat.engine()
    stream = chat.infer(TEXTS, stream=True, skip_refine_text=True, params_infer_code=forced(seed=9))
    next(stream)
    assert engine.has_unfinished_requests()
    stream.close()
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_used_blocks == 0


def test_interrupt_ends_the_stream_with_what_was_generated(chat: Chat) -> None:
    engine = chat.engine()
    params = InferCodeParams(manual_seed=1, max_new_token=400, min_new_token=400, show_tqdm=False, stream_batch=8)
    chunks = []
    for y in chat.infer(["Interrupt me please."], stream=True, skip_refine_text=True, params_infer_code=params):
        chunks.append(y)
        chat.interrupt()
    audio = joined(chunks, 1)[0]
    assert 0 < len(audio) < (2 * 400 - 1) * 256 and len(audio) % 256 == 0
    assert not engine.has_unfinished_requests() and engine.block_manager.num_used_blocks == 0


def test_small_first_chunk_is_early_and_only_it_is_approximate(chat: Chat) -> None:
    import torch

    from chattts_velocity.audio import decode_hidden_batch
    from chattts_velocity.speech import StreamOptions, StreamSet

    hidden = torch.randn(80, chat.decoder.decoder.idim * 2, generator=torch.Generator().manual_seed(0))  # [T, H]
    ref = decode_hidden_batch(chat.decoder, chat.vocos, [hidden])[0]
    streams = StreamSet(StreamOptions(chunk_steps=8, first_chunk_steps=4, first_lookahead_steps=2))
    streams.open("a", chat.pipeline.stages.mel("decoder"))
    parts, first_at = [], None
    for t in range(len(hidden)):
        chunk = streams.push({"a": hidden[t: t + 1]})["a"]
        if len(chunk) and first_at is None:
            first_at = t + 1
        parts.append(chunk)
    parts.append(streams.finish(["a"])["a"])
    first = next(len(p) for p in parts if len(p))
    got = np.concatenate(parts)
    assert first_at == 4 + 2 and first == 2 * 4 * 256  # exact settings would wait for 8 + 13 steps
    assert len(got) == len(ref)
    np.testing.assert_allclose(got[first:], ref[first:], rtol=0, atol=TOL)  # later chunks are exact again
    assert np.abs(got[:first] - ref[:first]).max() > TOL  # the first one is not (the test can fail)
