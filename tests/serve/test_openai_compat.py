"""What stock OpenAI clients send and expect, without the clients: free-text instructions, every voice and model
name of the openai client's types, x-request-id, streamed-by-default responses and the SSE done event's usage."""
from __future__ import annotations

import base64
import json
import typing

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402 (after the importorskip above)

from chattts_velocity.serve.free_text import MAX_HEADER_CHARS, free_text_levels, header_text  # noqa: E402
from chattts_velocity.serve.instructions import parse_instructions, speech_input  # noqa: E402
from chattts_velocity.text.voices import PRESET_SEEDS  # noqa: E402

AGENTS = "You will receive partial sentences. Do not complete the sentence just read out the text."


@pytest.mark.parametrize("text, speed, refine, applied, ignored", [
    (AGENTS, None, None, [], ["you will receive partial sentences",
                              "do not complete the sentence just read out the text"]),
    ("Speak slowly and cheerfully.", 3, None, ["speed 3"], []),
    ("Speak in a cheerful and positive tone.", None, None, [], ["speak in a cheerful and positive tone"]),
    ("Talk very quickly!", 9, None, ["speed 9"], []),
    ("Not too fast, please", None, None, [], ["not too fast", "please"]),
    ("Start slow, then get faster", 3, None, ["speed 3"], ["then get faster"]),  # the first speed wins
    ("Use [oral_2] and [laugh_1] here", None, "[oral_2][laugh_1]", ["oral 2", "laugh 1"], []),
    ("oral 3, sound excited", None, "[oral_3]", ["oral 3"], ["sound excited"]),  # grammar clauses still apply
    ("speed 12, refine beams 20, no refine", None, None, ["no refine"], ["speed 12", "refine beams 20"]),
    ("no refine, oral 2", None, None, ["no refine"], ["oral 2"]),
])
def test_free_text_applies_what_it_writes_out_and_reports_the_rest(text, speed, refine, applied, ignored) -> None:
    controls = parse_instructions(text, strict=False)
    assert (controls.speed, controls.refine_prompt()) == (speed, refine)
    assert (controls.applied, controls.ignored) == (applied, ignored)
    with pytest.raises(ValueError, match="^instructions: "):  # strict: the same text is refused
        parse_instructions(text if ignored else text + ", whisper")


def test_free_text_is_accepted_up_to_openais_limit() -> None:
    assert parse_instructions("x" * 4096, strict=False).ignored == ["x" * 4096]
    with pytest.raises(ValueError, match="at most 4096"):
        parse_instructions("x" * 4097, strict=False)
    assert free_text_levels("do not go slowly") == [] and free_text_levels("slowly") == [("speed", 3)]


def test_the_instructions_speed_yields_to_the_speed_field_unless_strict() -> None:
    plan = speech_input("Hi.", 2.0, "slowly, oral 1", None, strict=False)
    assert (plan.prompt, plan.refine.prompt, plan.applied) == ("[speed_8]", "[oral_1]", ("oral 1",))
    assert plan.ignored == ("speed 3 (the speed is set by speed)",)
    with pytest.raises(ValueError, match="^instructions: sets the speed"):
        speech_input("Hi.", 2.0, "slow", None, strict=True)


def test_header_text_is_printable_ascii_and_bounded() -> None:
    assert header_text("语速 slow\x01\n") == "\\u8bed\\u901f slow\\x01\\n"
    long = header_text("é" * 1000)
    assert len(long) == MAX_HEADER_CHARS and long.endswith("...") and long.isascii()


def openai_names() -> tuple[list[str], list[str]]:
    """The voices and models of the installed openai client's SpeechCreateParams (skipped without it)."""
    params = pytest.importorskip("openai.types.audio.speech_create_params")
    from openai.types.audio.speech_model import SpeechModel

    voices = [v for arg in typing.get_args(params.Voice) for v in typing.get_args(arg)]
    return voices, list(typing.get_args(SpeechModel))


def test_every_voice_and_model_of_the_openai_client_is_spoken(client: TestClient) -> None:
    voices, models = openai_names()
    assert len(voices) >= 13 and {"marin", "cedar"} <= set(voices) and set(voices) <= set(PRESET_SEEDS)
    for voice in [*voices, {"id": "cedar"}]:
        response = client.post("/v1/audio/speech", json={"input": "Hi.", "voice": voice, "response_format": "pcm",
                                                         "max_new_tokens": 4, "seed": 1})
        assert response.status_code == 200 and len(response.content) > 0, (voice, response.text)
    for model in [*models, "gpt-4o-mini-tts-2025-03-20"]:
        response = client.post("/v1/audio/speech", json={"model": model, "input": "Hi.", "response_format": "pcm",
                                                         "max_new_tokens": 4})
        assert response.status_code == 200, (model, response.text)
    listed = {m["id"] for m in client.get("/v1/models").json()["data"]}
    assert set(models) <= listed


def test_every_response_carries_a_request_id(client: TestClient) -> None:
    ok = client.post("/v1/audio/speech", json={"input": "Hi.", "response_format": "pcm", "max_new_tokens": 4},
                     headers={"x-request-id": "client-id-42"})
    assert ok.headers["x-request-id"] == "client-id-42"
    refused = client.post("/v1/audio/speech", json={"input": ""})
    generated = refused.headers["x-request-id"]
    assert refused.status_code == 400 and generated.startswith("req_")
    assert client.get("/health").headers["x-request-id"] not in ("", generated)
    odd = client.get("/health", headers={"x-request-id": "has space"}).headers["x-request-id"]
    assert odd.startswith("req_")  # an unusable id is replaced, never echoed


def test_audio_is_streamed_unless_stream_false_or_loudness(client: TestClient) -> None:
    body = {"input": "Hi there.", "response_format": "wav", "max_new_tokens": 8, "seed": 4}
    streamed = client.post("/v1/audio/speech", json=body)
    assert "content-length" not in streamed.headers  # chunked: sent as it is made
    assert streamed.content[4:8] == b"\xff\xff\xff\xff"  # the streamed WAV header: length unknown
    for whole_body in ({**body, "stream": False}, {**body, "loudness": -20}):
        whole = client.post("/v1/audio/speech", json=whole_body)
        assert whole.status_code == 200 and int(whole.headers["content-length"]) == len(whole.content)
        assert whole.content[4:8] != b"\xff\xff\xff\xff"


def test_sse_done_carries_openais_usage(client: TestClient) -> None:
    body = {"input": "Hi there.", "response_format": "pcm", "stream_format": "sse", "max_new_tokens": 6,
            "min_new_tokens": 6, "seed": 2}
    events = [json.loads(line[6:]) for line in client.post("/v1/audio/speech", json=body).text.splitlines()
              if line.startswith("data: ")]
    done = events[-1]
    assert done["type"] == "speech.audio.done" and set(done["usage"]) == {"input_tokens", "output_tokens",
                                                                         "total_tokens"}
    usage = done["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] >= 6  # 6 code steps at least (EOS may follow)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert sum(len(base64.b64decode(e["audio"])) for e in events[:-1]) > 0
