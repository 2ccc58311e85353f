"""The voice library, `instructions`, `model` and SSML through the app (tiny random weights, in process)."""
from __future__ import annotations

import io
import logging
import wave

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402 (after the importorskip above)

from chattts_velocity import Chat, RefineTextParams  # noqa: E402 (after the importorskip above)
from chattts_velocity.audio import open_encoder  # noqa: E402 (after the importorskip above)
from chattts_velocity.serve import ServerConfig, create_app  # noqa: E402 (after the importorskip above)
from chattts_velocity.text import decode_spk_emb  # noqa: E402 (after the importorskip above)

VOICES = "/v1/audio/voices"


@pytest.fixture(scope="module")
def chat(tiny_assets) -> Chat:
    chat = Chat()
    chat.load(source="custom", custom_path=tiny_assets, verify=False, use_vllm=True)
    return chat


def _client(chat: Chat, voices_dir, **config) -> TestClient:
    # X-Requested-With: a multipart upload needs a header no web page's form can send (serve/origin.py)
    return TestClient(create_app(chat, ServerConfig(voices_dir=str(voices_dir), warmup_steps=0, max_new_token=64,
                                                    **config)), headers={"X-Requested-With": "tests"})


def _speak(client: TestClient, **body) -> np.ndarray:
    body = {"model": "tts-1", "input": "Hello there.", "response_format": "wav", "seed": 3, "max_new_tokens": 12,
            **body}
    response = client.post("/v1/audio/speech", json=body)
    assert response.status_code == 200, response.text
    with wave.open(io.BytesIO(response.content)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def _error(response, status: int, param: str | None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param
    return error


def _spy(client: TestClient, monkeypatch) -> list[list[str]]:
    """The sentence pieces (as the model reads them) of every speech request."""
    seen, frontend = [], client.app.state.server.pipeline.stages.frontend
    original = frontend.code_requests
    monkeypatch.setattr(frontend, "code_requests", lambda pieces, *a, **kw: seen.append(list(pieces.texts))
                        or original(pieces, *a, **kw))
    return seen


def test_a_voice_made_from_a_speaker_string_is_listed_spoken_and_survives_a_restart(chat, tmp_path) -> None:
    speaker = chat.sample_random_speaker()
    with _client(chat, tmp_path) as client:
        created = client.post(VOICES, json={"name": "Narrator 1", "speaker": speaker})
        assert created.status_code == 201 and created.json()["speaker"] == speaker
        listed = {v["id"]: v for v in client.get(VOICES).json()["data"]}
        assert listed["Narrator 1"]["speaker"] == speaker and listed["alloy"]["kind"] == "preset"
        assert decode_spk_emb(listed["alloy"]["speaker"]).numel() == chat.config.hidden_size
        by_string = _speak(client, voice=speaker)
        assert np.array_equal(_speak(client, voice="narrator 1"), by_string)
    with _client(chat, tmp_path) as client:  # a new app on the same folder: the voice is still there
        assert client.get(f"{VOICES}/Narrator 1").json()["speaker"] == speaker
        assert np.array_equal(_speak(client, voice={"id": "Narrator 1"}), by_string)
        assert not np.array_equal(_speak(client, voice="alloy"), by_string)


def test_voice_errors_have_openai_shape_and_status(chat, tmp_path) -> None:
    speaker = chat.sample_random_speaker()
    with _client(chat, tmp_path) as client:
        assert client.post(VOICES, json={"name": "a", "speaker": speaker}).status_code == 201
        assert _error(client.post(VOICES, json={"name": "A", "speaker": speaker}), 409, "name")["code"] == \
            "voice_exists"
        assert client.post(VOICES, json={"name": "A", "speaker": speaker, "overwrite": True}).status_code == 201
        _error(client.post(VOICES, json={"name": "../evil", "speaker": speaker}), 400, "name")
        _error(client.post(VOICES, json={"name": "nova", "speaker": speaker}), 400, "name")
        _error(client.post(VOICES, json={"name": "b", "speaker": "junk"}), 400, "speaker")
        _error(client.post(VOICES, json={"name": "b", "speaker": speaker, "colour": 1}), 400, "colour")
        _error(client.get(f"{VOICES}/nobody"), 404, "voice")
        _error(client.delete(f"{VOICES}/alloy"), 400, "name")
        _error(client.post("/v1/audio/speech", json={"input": "Hi.", "voice": "nobody"}), 400, "voice")
        assert client.delete(f"{VOICES}/a").json()["deleted"] is True
        _error(client.delete(f"{VOICES}/a"), 404, "voice")
        assert [v["id"] for v in client.get(VOICES).json()["data"] if v["kind"] == "saved"] == []


def _wav_file(seconds: float, rate: int) -> bytes:
    import soundfile as sf

    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    sf.write(buffer, 0.3 * np.sin(2 * np.pi * 220 * t), rate, format="WAV")
    return buffer.getvalue()


def test_a_voice_cloned_from_an_upload_speaks_with_its_clip(chat, tmp_path, monkeypatch) -> None:
    with _client(chat, tmp_path, max_upload_bytes=200_000) as client:
        created = client.post(VOICES, data={"name": "clip", "transcript": "a test clip"},
                              files={"file": ("clip.wav", _wav_file(1.0, 16000), "audio/wav")})
        assert created.status_code == 201, created.text
        voice = created.json()
        assert voice["has_clip"] and voice["speaker"] is None and voice["transcript"] == "a test clip"
        prompts = []
        original = chat.pipeline.stages.frontend.code_requests
        monkeypatch.setattr(chat.pipeline.stages.frontend, "code_requests",
                            lambda *a, **kw: prompts.append(original(*a, **kw)) or prompts[-1])
        assert len(_speak(client, voice="clip")) > 0
        assert all(p.input_ids.shape[0] > 40 for p in prompts[0].prompts)  # the clip's codes are in the prompt
        _error(client.post(VOICES, data={"name": "x", "transcript": "t"},
                           files={"file": ("x.wav", b"not audio", "audio/wav")}), 400, "file")
        _error(client.post(VOICES, data={"name": "x", "transcript": "t"},
                           files={"file": ("x.wav", _wav_file(31.0, 1000), "audio/wav")}), 413, "file")
        streamed = open_encoder("flac")
        streamed_flac = streamed.encode(np.zeros(24000, np.float32)) + streamed.flush()  # its header: no length
        assert "holds no length" in _error(client.post(VOICES, data={"name": "x", "transcript": "t"}, files={
            "file": ("x.flac", streamed_flac, "audio/flac")}), 400, "file")["message"]
        _error(client.post(VOICES, data={"name": "x"}, files={"file": ("x.wav", _wav_file(1, 8000), "a/b")}), 400,
               "transcript")
        too_big = client.post(VOICES, data={"name": "x", "transcript": "t"},
                              files={"file": ("x.wav", _wav_file(10.0, 24000), "audio/wav")})
        assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "request_too_large"


def test_unknown_model_is_openai_404_and_known_names_work(chat, tmp_path) -> None:
    with _client(chat, tmp_path) as client:
        error = _error(client.post("/v1/audio/speech", json={"model": "tts-9", "input": "Hi."}), 404, "model")
        assert error["code"] == "model_not_found" and "chattts" in error["message"]
        for model in ("chattts", "tts-1-hd", "gpt-4o-mini-tts", "gpt-4o-mini-tts-2025-12-15",
                      "gpt-4o-mini-tts-2025-03-20"):
            assert len(_speak(client, model=model)) > 0
        for model in ("gpt-4o-mini-tts-2025", "gpt-4o-mini-tts-2025-03-20x", "tts-1-2025-03-20"):
            _error(client.post("/v1/audio/speech", json={"model": model, "input": "Hi."}), 404, "model")


def test_instructions_reach_the_refine_pass_or_are_refused_when_strict(chat, tmp_path, monkeypatch) -> None:
    with _client(chat, tmp_path, strict_instructions=True) as client:
        refines, original = [], chat.pipeline.stages.frontend.refine_requests
        monkeypatch.setattr(chat.pipeline.stages.frontend, "refine_requests", lambda pieces, params:
                            refines.append(params.prompt) or original(pieces, params))
        _speak(client, instructions="no refine, speed 3")
        assert refines == []
        seen = _spy(client, monkeypatch)
        _speak(client, instructions="Oral 3; break 4, slow")
        assert refines == ["[oral_3][break_4]"]
        error = _error(client.post("/v1/audio/speech", json={"input": "Hi.", "instructions": "whisper sadly"}), 400,
                       "instructions")
        assert "whisper sadly" in error["message"] and "laugh 0-2" in error["message"]
        _error(client.post("/v1/audio/speech", json={"input": "Hi.", "instructions": "fast", "speed": 2}), 400,
               "instructions")
    # the refine pass on the server's shared engine reads what Chat.infer's refine pass reads (same seed)
    same = RefineTextParams(prompt="[oral_3][break_4]", manual_seed=3, show_tqdm=False)
    assert seen[0] == [chat.infer("Hello there.", refine_text_only=True, params_refine_text=same, use_vllm=True)]


def test_free_text_instructions_are_applied_where_understood_and_reported(chat, tmp_path, monkeypatch,
                                                                         caplog) -> None:
    caplog.set_level(logging.INFO, logger="chattts_velocity.serve")
    with _client(chat, tmp_path) as client:
        prompts, original = [], chat.pipeline.stages.frontend.code_requests
        monkeypatch.setattr(chat.pipeline.stages.frontend, "code_requests", lambda pieces, params, *a, **kw:
                            prompts.append(params[0].prompt) or original(pieces, params, *a, **kw))
        body = {"input": "Hi.", "response_format": "wav", "max_new_tokens": 8, "stream": False}
        agents = "You will receive partial sentences. Do not complete the sentence just read out the text."
        ignored = client.post("/v1/audio/speech", json={**body, "instructions": agents})
        assert ignored.status_code == 200 and ignored.headers["x-chattts-instructions-applied"] == "none"
        assert ignored.headers["x-chattts-instructions-ignored"] == ("you will receive partial sentences; do not "
                                                                     "complete the sentence just read out the text")
        logged = [r.getMessage() for r in caplog.records if "instructions applied" in r.getMessage()]
        assert logged and ignored.headers["x-request-id"] in logged[-1] and "partial sentences" in logged[-1]
        slow = client.post("/v1/audio/speech", json={**body, "instructions": "Speak slowly and cheerfully."})
        assert slow.headers["x-chattts-instructions-applied"] == "speed 3"
        assert "x-chattts-instructions-ignored" not in slow.headers
        both = client.post("/v1/audio/speech", json={**body, "instructions": "fast", "speed": 2})
        assert both.status_code == 200 and both.headers["x-chattts-instructions-applied"] == "none"
        assert both.headers["x-chattts-instructions-ignored"] == "speed 7 (the speed is set by speed)"
        plain = client.post("/v1/audio/speech", json=body)
        assert "x-chattts-instructions-applied" not in plain.headers
        assert prompts == ["[speed_5]", "[speed_3]", "[speed_8]", "[speed_5]"]


def test_ssml_with_a_break_and_a_date_is_spoken_as_written(chat, tmp_path, monkeypatch) -> None:
    with _client(chat, tmp_path) as client:
        seen = _spy(client, monkeypatch)
        ssml = ('<speak>We met <break time="700ms"/> on <say-as interpret-as="date">2024-03-05</say-as>.'
                '<break time="2s"/> Bye.</speak>')
        assert len(_speak(client, input=ssml)) > 0
        spoken = " ".join(seen[0])
        assert "[uv_break]" in spoken and "[lbreak]" in spoken and "fifth of march twenty twenty four" in spoken
        assert "<" not in spoken and "2024" not in spoken
        error = _error(client.post("/v1/audio/speech", json={"input": "<speak>\n  <b>x</b></speak>"}), 400, "input")
        assert "line 2 column 3" in error["message"]
