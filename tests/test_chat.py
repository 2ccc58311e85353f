"""Chat end to end on tiny random weights: upstream's API, one waveform per text, clear errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from chattts_velocity import Chat, InferCodeParams, RefineTextParams

STEPS = 12


@pytest.fixture(scope="module")
def chat(tiny_assets) -> Chat:
    chat = Chat()
    assert chat.load(source="custom", custom_path=tiny_assets, verify=False)
    return chat


def forced(**kw) -> InferCodeParams:
    return InferCodeParams(max_new_token=STEPS, min_new_token=STEPS, show_tqdm=False, **kw)


def test_one_waveform_per_text_with_forced_length(chat: Chat) -> None:
    wavs = chat.infer(["Hello world.", "A second, longer text to say."], skip_refine_text=True,
                      params_infer_code=forced(manual_seed=3))
    assert len(wavs) == 2
    for wav in wavs:
        assert wav.dtype == np.float32 and wav.ndim == 1
        assert len(wav) == (2 * STEPS - 1) * 256
        assert np.isfinite(wav).all() and np.abs(wav).max() > 0


def test_string_input_splits_and_joins_into_one_waveform(chat: Chat) -> None:
    wavs = chat.infer("First sentence. Second sentence.", skip_refine_text=True,
                      params_infer_code=forced(manual_seed=1))
    assert len(wavs) == 1
    assert len(wavs[0]) == 2 * (2 * STEPS - 1) * 256  # two pieces, concatenated


def test_use_decoder_false_uses_dvae(chat: Chat) -> None:
    wavs = chat.infer(["Hello."], skip_refine_text=True, use_decoder=False,
                      params_infer_code=forced(manual_seed=1))
    assert len(wavs[0]) == (2 * STEPS - 1) * 256


def test_same_seed_same_audio_and_params_not_mutated(chat: Chat) -> None:
    params = forced(manual_seed=7, spk_emb=chat.sample_random_speaker())
    before = dict(vars(params))
    a = chat.infer(["Hello there."], skip_refine_text=True, params_infer_code=params)[0]
    b = chat.infer(["Hello there."], skip_refine_text=True, params_infer_code=params)[0]
    np.testing.assert_array_equal(a, b)
    assert vars(params) == before


def test_speaker_changes_the_audio(chat: Chat) -> None:
    torch.manual_seed(0)
    s1, s2 = chat.sample_random_speaker(), chat.sample_random_speaker()
    a = chat.infer(["Hello."], skip_refine_text=True, params_infer_code=forced(manual_seed=1, spk_emb=s1))[0]
    b = chat.infer(["Hello."], skip_refine_text=True, params_infer_code=forced(manual_seed=1, spk_emb=s2))[0]
    assert not np.array_equal(a, b)


def test_refine_text_only_returns_text(chat: Chat) -> None:
    params = RefineTextParams(max_new_token=6, show_tqdm=False, manual_seed=2)
    out = chat.infer(["hello world", "second"], refine_text_only=True, params_refine_text=params)
    assert isinstance(out, list) and len(out) == 2 and all(isinstance(t, str) for t in out)


def test_sample_audio_speaker_round_trip(chat: Chat) -> None:
    wav = chat.infer(["Hello."], skip_refine_text=True, params_infer_code=forced(manual_seed=1))[0]
    spk_smp = chat.sample_audio_speaker(wav)
    wavs = chat.infer(["Hello again."], skip_refine_text=True,
                      params_infer_code=forced(manual_seed=1, spk_smp=spk_smp, txt_smp="Hello."))
    assert len(wavs[0]) == (2 * STEPS - 1) * 256


@pytest.mark.parametrize("bad, field", [
    ([], "text"), ("", "text"), ([1, "a"], "text[0]"), (["ok", None], "text[1]"),
])
def test_bad_texts(chat: Chat, bad, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace("[", r"\[")):
        chat.infer(bad, skip_refine_text=True)


@pytest.mark.parametrize("kwargs, field", [
    (dict(temperature=0), "temperature"), (dict(temperature=-1.0), "temperature"),
    (dict(top_P=0), "top_P"), (dict(top_P=1.5), "top_P"), (dict(top_K=0), "top_K"),
    (dict(max_new_token=-1), "max_new_token"), (dict(min_new_token=-2), "min_new_token"),
])
def test_bad_params(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        InferCodeParams(**kwargs)


def test_bad_speaker_and_clip(chat: Chat) -> None:
    with pytest.raises(ValueError, match="speaker"):
        chat.infer(["Hi."], skip_refine_text=True, params_infer_code=forced(spk_emb="not a speaker"))
    with pytest.raises(ValueError, match="1-D|mono"):
        chat.sample_audio_speaker(np.zeros((2, 24000), np.float32))
    with pytest.raises(ValueError, match="24"):
        chat.sample_audio_speaker(np.zeros(16000, np.float32), sample_rate=16000)


def test_infer_before_load_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="load"):
        Chat().infer(["Hi."])


@pytest.mark.parametrize("use_vllm", [False, True])
def test_infer_many_reports_a_bad_item_and_finishes_the_others(chat: Chat, use_vllm: bool) -> None:
    texts = ["First good text.", "A bad speaker.", "Second good text."]
    params = [forced(manual_seed=1), forced(manual_seed=2, spk_emb=torch.zeros(5)), forced(manual_seed=3)]
    results = dict(chat.infer_many(texts, params, use_vllm=use_vllm))
    assert sorted(results) == [0, 1, 2]
    assert isinstance(results[1], ValueError) and "spk_emb" in str(results[1])
    for i in (0, 2):
        assert isinstance(results[i], np.ndarray) and len(results[i]) == (2 * STEPS - 1) * 256
    alone = dict(chat.infer_many(texts[2:], params[2:], use_vllm=use_vllm))[0]
    # the failed neighbour changed nothing (the batch's GEMM sizes may move the float rounding of the hidden states)
    np.testing.assert_allclose(results[2], alone, atol=1e-5)


def test_infer_many_on_the_engine_reports_a_request_it_refuses(chat: Chat) -> None:
    too_long = InferCodeParams(max_new_token=10**6, show_tqdm=False)
    results = dict(chat.infer_many(["Fine.", "Too long a request."], [forced(manual_seed=1), too_long],
                                   use_vllm=True))
    assert isinstance(results[1], ValueError) and "max_model_len" in str(results[1])
    assert isinstance(results[0], np.ndarray) and len(results[0]) == (2 * STEPS - 1) * 256
    assert not chat.engine().has_unfinished_requests()


@pytest.mark.parametrize("use_vllm", [False, True])
def test_lengths_beyond_the_model_are_clear_errors_on_both_paths(chat: Chat, use_vllm: bool) -> None:
    huge = InferCodeParams(max_new_token=10**9, show_tqdm=False)
    with pytest.raises(ValueError, match="max_new_token"):
        chat.infer(["Hello."], skip_refine_text=True, params_infer_code=huge, use_vllm=use_vllm)
    long_text = "w " * 8000  # one piece of ~8000 prompt positions, under the character limit
    with pytest.raises(ValueError, match="max_new_token|max_model_len|max_position_embeddings"):
        chat.infer([long_text], skip_refine_text=True, split_text=False, use_vllm=use_vllm,
                   params_infer_code=InferCodeParams(max_new_token=8, show_tqdm=False))
    with pytest.raises(ValueError, match=r"^text\[0\]: a sentence of 25000 characters is over the limit"):
        chat.infer(["word " * 5000], skip_refine_text=True, split_text=False, use_vllm=use_vllm)
    with pytest.raises(ValueError, match=r"^text: 1000000 characters is over the limit"):
        chat.infer("a b " * 250000, skip_refine_text=True, use_vllm=use_vllm)  # refused before normalisation


def test_a_fast_engine_decodes_audio_in_bf16_where_the_cpu_has_it(tiny_assets) -> None:
    from chattts_velocity import audio
    from chattts_velocity.model import kernels
    from chattts_velocity.text import split_pieces

    default = Chat()
    default.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True, dtype="bfloat16")
    assert default.decode_dtype == (torch.bfloat16 if kernels.native_bf16() else None)
    fast = Chat()
    fast.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True, dtype="bfloat16",
              decode_dtype="bfloat16")
    assert fast.decode_dtype == torch.bfloat16
    params = forced(manual_seed=4)
    wav = fast.infer(["Hello there."], skip_refine_text=True, params_infer_code=params)[0]
    req = fast.speech_requests(split_pieces(["Hello there."]), params)
    hidden = [o.hidden for o in fast.gpt().generate(req.prompts, req.sampling, False)]
    in_bf16 = audio.decode_hidden_batch(fast.decoder, fast.vocos, hidden, torch.bfloat16)[0]
    in_fp32 = audio.decode_hidden_batch(fast.decoder, fast.vocos, hidden)[0]
    np.testing.assert_array_equal(wav, in_bf16)
    assert not np.array_equal(wav, in_fp32) and np.abs(wav - in_fp32).max() < 0.05


def test_audio_precision_is_bf16_on_cuda_or_native_bf16_cpus_and_float32_on_request() -> None:
    from chattts_velocity.precision import Precision

    def audio(choice: str | None, dtype: str, device: str, cpu_bf16: bool = True) -> torch.dtype | None:
        return Precision.decide(dtype, decode_dtype=choice, device=device, cpu_bf16=cpu_bf16).audio

    assert audio(None, "float32", "cpu") is None  # the exact CPU default is unchanged
    assert audio(None, "float32", "cuda") == torch.bfloat16  # the GPU default
    assert audio(None, "int8", "cpu") == torch.bfloat16
    assert audio(None, "int8", "cpu", cpu_bf16=False) is None  # AVX2 / NEON: bf16 is emulated there
    assert audio("float32", "bfloat16", "cuda") is None
    with pytest.raises(ValueError, match="decode_dtype"):
        audio("float16", "float32", "cpu")


def test_kv_cache_dtype_reaches_the_engine_and_only_the_engine(tiny_assets) -> None:
    # the tiny model's head_dim 16 rules out the cpu backend, the only one reading int8 pools: the error shows
    # that the option arrived
    with pytest.raises(ValueError, match="kv_cache_dtype: 'int8' needs the cpu backend, which cannot run here"):
        Chat().load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True, dtype="bfloat16",
                    kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="kv_cache_dtype=int8.*only apply to the velocity engine"):
        Chat().load(source="custom", custom_path=tiny_assets, verify=False, dtype="bfloat16", kv_cache_dtype="int8")


@pytest.mark.parametrize("texts", [["a"] * 100_000, ["One. Two. Three. Four."] * 600])
def test_a_call_over_max_call_pieces_is_refused_before_any_work(chat: Chat, texts: list[str], monkeypatch) -> None:
    """Refused before normalising, let alone generating: the normaliser (watched) reads none of the texts, and
    reads the next call's, so the watch is on the path the texts take."""
    from chattts_velocity.text import Normalizer
    from chattts_velocity.text.pieces import MAX_CALL_PIECES

    normalised: list[str] = []
    normalise = Normalizer.__call__
    monkeypatch.setattr(Normalizer, "__call__", lambda self, text, *a, **k: normalised.append(text)
                        or normalise(self, text, *a, **k))
    for call in (lambda: chat.infer(texts), lambda: list(chat.infer_many(texts, [InferCodeParams()] * len(texts)))):
        with pytest.raises(ValueError, match=f"^text: .* over the limit of {MAX_CALL_PIECES} sentence pieces"):
            call()
    assert normalised == []
    chat.split("One. Two.")
    assert normalised
