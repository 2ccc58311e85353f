"""Voice blends, scripts and captions on the server (tiny weights, in process): each turn with its voice, pauses to
the sample in the streamed audio, the caption file in the SSE done event, bad tags and blends as 400s naming them."""
from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402 (after the importorskip above)

from chattts_velocity.audio.wav import samples_for_steps  # noqa: E402 (after the importorskip above)

STEPS = 12
PIECE = samples_for_steps(STEPS)  # every piece's audio with min_new_tokens == max_new_tokens


def speech(client: TestClient, **body) -> tuple[int, dict | bytes]:
    body = {"seed": 5, "max_new_tokens": STEPS, "min_new_tokens": STEPS, "response_format": "pcm", **body}
    response = client.post("/v1/audio/speech", json=body)
    return response.status_code, response.json()["error"] if response.status_code >= 400 else response.content


def sse(client: TestClient, **body) -> tuple[np.ndarray, list[dict]]:
    status, content = speech(client, stream_format="sse", **body)
    assert status == 200 and isinstance(content, bytes), content
    events = [json.loads(line[6:]) for line in content.decode().splitlines() if line.startswith("data: ")]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    return np.frombuffer(audio, np.int16), events


def test_a_blend_is_one_reproducible_voice_and_its_weights_matter(client: TestClient) -> None:
    first = speech(client, input="Hello there.", voice="alloy(2)+1234(1)")
    assert first[0] == 200 and speech(client, input="Hello there.", voice=" alloy(2) + 1234(1)") == first
    assert speech(client, input="Hello there.", voice="alloy(1)+1234(2)") != first
    voices = client.app.state.server.voices
    assert voices.kind("alloy(2)+1234(1)") == "blend"
    mixed = voices.resolve("alloy(2)+1234(1)")
    assert speech(client, input="Hello there.", voice=mixed) == first  # the blend is an ordinary speaker string


def test_a_blends_speaker_string_can_be_fetched_and_saved_under_a_name(client: TestClient) -> None:
    from urllib.parse import quote

    got = client.get("/v1/audio/voices/" + quote("alloy(2)+1234(1)"))
    assert got.status_code == 200 and got.json()["kind"] == "blend"
    assert got.json()["speaker"] == client.app.state.server.voices.resolve("alloy(2)+1234(1)")
    saved = client.post("/v1/audio/voices", json={"name": "Mixed", "speaker": got.json()["speaker"]})
    assert saved.status_code == 201
    assert speech(client, input="Hello there.", voice="Mixed") == speech(client, input="Hello there.",
                                                                         voice="alloy(2)+1234(1)")
    bad = client.get("/v1/audio/voices/" + quote("alloy(0)+echo"))
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "voice"


@pytest.mark.parametrize("voice, says", [("alloy(0)+echo", "weight"), ("alloy+nobody", "blend part 'nobody'"),
                                         ("a+b+c+d+e", "at most 4 parts"), ("alloy(2", "not a blend part")])
def test_a_bad_blend_is_a_400_naming_voice(client: TestClient, voice: str, says: str) -> None:
    status, error = speech(client, input="Hi.", voice=voice)
    assert status == 400 and isinstance(error, dict) and error["param"] == "voice" and says in error["message"]


def test_a_script_streams_each_turn_with_its_pauses_exact_to_the_sample(client: TestClient) -> None:
    text = "[pause: 0.5s] Hello there. [voice: echo] [pause: 250ms] Hi. [voice: alloy(2)+7] Bye. [pause: 1ms]"
    audio, events = sse(client, input=text, captions="srt", timestamps=True)
    layout = [12000, PIECE, 6000, PIECE, 0, PIECE, 24]  # silence, speech, silence, ...
    assert len(audio) == sum(layout)
    edges = np.cumsum([0, *layout])
    for k in range(0, len(layout), 2):
        assert not audio[edges[k] : edges[k + 1]].any()  # each pause is exact zeros, to the sample
    for k in range(1, len(layout), 2):
        assert audio[edges[k] : edges[k + 1]].any()
    stamps = [e for e in events if e["type"] == "speech.audio.timestamp"]
    assert [s["start"] for s in stamps] == [0.5, round((12000 + PIECE + 6000) / 24000, 4),
                                            round((12000 + 2 * PIECE + 6000) / 24000, 4)]
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    cues = re.findall(r"(\d+)\n(\S+) --> (\S+)\n(.+)\n", done["captions"])
    assert [c[3] for c in cues] == [s["text"].strip() for s in stamps] and cues[0][1] == "00:00:00,500"


def test_turns_speak_in_their_own_voice(client: TestClient) -> None:
    """A turn with [voice: X] sounds as X does alone: the same samples as a request in that voice."""
    status, alone = speech(client, input="Hi.", voice="echo", stream=True)
    audio, _ = sse(client, input="[voice: echo] Hi.")
    assert status == 200 and isinstance(alone, bytes) and audio.tobytes() == alone


def test_captions_come_with_sse_only_and_bad_tags_are_400s_naming_input(client: TestClient) -> None:
    status, error = speech(client, input="Hi.", captions="srt")
    assert status == 400 and isinstance(error, dict) and error["param"] == "captions"
    status, error = speech(client, input="Hi.", captions="ass", stream_format="sse")
    assert status == 400 and isinstance(error, dict) and error["param"] == "captions"
    for text, says in (("Hi [pause: later] there.", "[pause: later]"), ("Hi [voice: nobody] there.",
                                                                        "[voice: nobody]: unknown voice")):
        status, error = speech(client, input=text)
        assert status == 400 and isinstance(error, dict) and error["param"] == "input" and says in error["message"]


def test_chattts_tokens_still_work_beside_script_tags(client: TestClient) -> None:
    audio, events = sse(client, input="Hello [uv_break] there. [pause: 10ms] Again [laugh] now.", timestamps=True)
    stamps = [e["text"] for e in events if e["type"] == "speech.audio.timestamp"]
    assert len(stamps) == 2 and "[uv_break]" in stamps[0] and "[laugh]" in stamps[1]
    assert len(audio) == 2 * PIECE + 240
