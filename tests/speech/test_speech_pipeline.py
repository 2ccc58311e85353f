"""SpeechPipeline on tiny random weights: the front end's one speaker check and one decode per request, the mel
sources' facts, requests built by keyword, and Chat as its facade."""
from __future__ import annotations

import pytest
import torch

from chattts_velocity import Chat, InferCodeParams, RefineTextParams, text
from chattts_velocity.speech import DecoderSource, DVAESource, SpeechPipeline, SynthesisJob, frontend
from chattts_velocity.text import speaker as speaker_module

STEPS = 6


@pytest.fixture(scope="module")
def pipeline(tiny_assets) -> SpeechPipeline:
    return SpeechPipeline.load(tiny_assets, device="cpu")


def forced(**kw) -> InferCodeParams:
    return InferCodeParams(max_new_token=STEPS, min_new_token=STEPS, show_tqdm=False, **kw)


def counted(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[str]:
    """Replace module.name by a wrapper that records each call's first argument."""
    calls, original = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda s, *a, **kw: calls.append(s) or original(s, *a, **kw))
    return calls


def test_a_speaker_and_its_voice_sample_are_decoded_once_per_request(pipeline, monkeypatch) -> None:
    speaker = pipeline.speakers.random(seed=1)
    clip = text.encode_prompt(torch.randint(0, 625, (4, 8)))
    speakers = counted(monkeypatch, speaker_module, "decode_spk_emb")
    clips = counted(monkeypatch, frontend, "decode_prompt")
    pieces = pipeline.stages.frontend.pieces(["One. Two. Three.", "Four. Five."])
    assert len(pieces.texts) == 5
    requests = pipeline.stages.code_requests(pieces, forced(spk_emb=speaker, spk_smp=clip, txt_smp="a clip"))
    assert len(requests.prompts) == 5 and all(p.spk_emb is not None for p in requests.prompts)
    assert speakers == [speaker] and clips == [clip]  # one params object: decoded once for all five pieces
    pipeline.stages.code_requests(pieces, [forced(spk_emb=speaker), forced(spk_emb=speaker)])
    assert len(speakers) == 3  # one params per text: each text's request decodes its own speaker once


def test_a_wrong_width_speaker_is_one_value_error_naming_spk_emb(pipeline) -> None:
    hidden = pipeline.config.hidden_size
    wrong = text.encode_spk_emb(torch.randn(hidden + 3))
    pieces = pipeline.stages.frontend.pieces(["One. Two."])
    for spk_emb, width in ((wrong, hidden + 3), (torch.randn(hidden - 1), hidden - 1)):
        with pytest.raises(ValueError, match=rf"^spk_emb: this speaker has {width} values but the model needs "
                                             rf"{hidden}"):
            pipeline.stages.code_requests(pieces, forced(spk_emb=spk_emb))
    with pytest.raises(ValueError, match=rf"^speaker: this speaker has {hidden + 3} values"):
        pipeline.speakers.check(wrong, field="speaker")  # other callers name their own field
    pipeline.speakers.check(pipeline.speakers.random(seed=2))  # a voice of this model passes
    assert pipeline.stages.frontend.speaker(pipeline.speakers.random(seed=2)).shape == (hidden,)


def test_each_mel_source_says_what_the_gpt_returns_and_how_wide_its_rows_are(pipeline) -> None:
    decoder, dvae = pipeline.stages.mel("decoder"), pipeline.stages.mel("dvae")
    assert isinstance(decoder, DecoderSource) and isinstance(dvae, DVAESource)
    assert (decoder.return_hidden, decoder.row_width) == (True, pipeline.config.hidden_size)
    assert (dvae.return_hidden, dvae.row_width) == (False, 4)
    pieces = pipeline.stages.frontend.pieces(["Hello there."])
    for mel in (decoder, dvae):
        requests = pipeline.stages.code_requests(pieces, forced(manual_seed=3), mel)
        assert [s.return_hidden for s in requests.sampling] == [mel.return_hidden]
        output = pipeline.stages.gpt().generate(requests.prompts, requests.sampling, False)[0]
        assert mel.rows(output).shape == (STEPS, mel.row_width)
        assert mel.stream_decoder().width == mel.row_width
        assert len(mel.decode([output])[0]) == (2 * STEPS - 1) * 256
    with pytest.raises(ValueError, match="mel source"):
        pipeline.stages.mel("vocos")


def test_requests_are_built_by_keyword_and_control_tokens_are_checked(pipeline) -> None:
    frontend = pipeline.stages.frontend
    pieces = frontend.pieces(["Hello there."], normalize=False, split=False)
    with pytest.raises(TypeError):
        frontend.pieces(["Hello."], None, True)  # no positional booleans
    with pytest.raises(TypeError):
        frontend.code_requests(pieces, forced(), True)
    assert len(frontend.code_requests(pieces, forced(), return_hidden=False).prompts) == 1
    with pytest.raises(ValueError, match=r"^prompt: \[speed_12\] is not a control token; speed levels are 0 to 9"):
        frontend.code_requests(pieces, forced(prompt="[speed_12]"), return_hidden=True)
    with pytest.raises(ValueError, match=r"^prompt: \[laugh_3\]"):
        frontend.refine_requests(pieces, RefineTextParams(prompt="[oral_2][laugh_3]"))
    prompts, sampling = frontend.refine_requests(pieces, RefineTextParams(prompt="[oral_2][laugh_0][break_6]"))
    assert len(prompts) == 1 and sampling.mode == "text" and not sampling.return_hidden


def test_engine_is_the_velocity_backends_and_the_plain_path_has_none(pipeline) -> None:
    assert pipeline.stages.gpt("plain").engine is None
    engine = pipeline.stages.engine()
    assert engine is pipeline.stages.gpt("velocity").engine and engine.config.hidden_size == pipeline.config.hidden_size


def test_chat_is_the_facade_over_its_pipeline(tiny_assets) -> None:
    chat = Chat()
    with pytest.raises(RuntimeError, match="load"):
        chat.pipeline  # noqa: B018 -- the property's error is what is tested
    assert chat.load(source="custom", custom_path=tiny_assets, verify=False)
    assert chat.pipeline.stages.frontend.normalizer is chat.normalizer  # a normaliser registered on Chat is used
    params = forced(manual_seed=5)
    wav = chat.infer(["Hello there."], skip_refine_text=True, params_infer_code=params)[0]
    job = SynthesisJob(["Hello there."], params)
    assert (wav == chat.pipeline.synthesis(job).run()[0]).all()  # Chat.infer is the job's run
    streamed = list(chat.pipeline.synthesis(job).stream())  # the job's shape: whole clips
    assert len(streamed) == 1 and (wav == streamed[0][0]).all()  # run is that stream collected


def test_unreadable_characters_are_named_once_per_request_not_per_sentence(pipeline, caplog) -> None:
    caplog.set_level("WARNING")
    pieces = pipeline.stages.frontend.pieces("First one ☃. Second one 😀. Third one ☃.", normalize=False)
    assert len(pieces.texts) == 3
    warned = [r.getMessage() for r in caplog.records if "dropped characters" in r.getMessage()]
    assert warned == ["dropped characters the model cannot read: ☃ 😀"]
