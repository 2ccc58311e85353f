"""Browser-safe writes (serve/origin.py): a web page on another origin cannot overwrite a voice, delete one or
spend the engine through the user's browser; clients that are not browsers pass as before."""
from __future__ import annotations

import json

import pytest

from chattts_velocity.serve.origin import BrowserGuard

VOICES = "/v1/audio/voices"
SPEAKER = None


def _speaker(client) -> str:
    return client.get(VOICES + "/alloy").json()["speaker"]


def _refused(response, status: int, code: str) -> None:
    assert response.status_code == status, response.text[:300]
    assert response.json()["error"]["code"] == code


@pytest.mark.parametrize("kind", ["json", "multipart", "text/plain"])
def test_a_cross_origin_voice_overwrite_is_403_and_changes_nothing(client, kind: str) -> None:
    speaker = _speaker(client)
    assert client.post(VOICES, json={"name": "mine", "speaker": speaker, "overwrite": True}).status_code == 201
    fields = {"name": "mine", "speaker": "evil", "overwrite": "true"}
    headers = {"Origin": "http://evil.example"}
    if kind == "json":
        answer = client.post(VOICES, json=fields, headers=headers)
    elif kind == "multipart":
        answer = client.post(VOICES, data=fields, files={"file": ("x.wav", b"x", "audio/wav")}, headers=headers)
    else:
        answer = client.post(VOICES, content=json.dumps(fields), headers={**headers, "Content-Type": "text/plain"})
    _refused(answer, 403, "cross_origin_refused")
    assert client.get(VOICES + "/mine").json()["speaker"] == speaker
    _refused(client.delete(VOICES + "/mine", headers=headers), 403, "cross_origin_refused")
    _refused(client.post("/v1/audio/speech", json={"input": "Hi."}, headers=headers), 403, "cross_origin_refused")
    assert client.get(VOICES + "/mine").status_code == 200


def test_form_bodies_need_a_header_no_form_can_send(client) -> None:
    fields = {"name": "formed", "transcript": "t"}
    upload = {"file": ("x.wav", b"not audio", "audio/wav")}
    _refused(client.post(VOICES, data=fields, files=upload), 403, "csrf_header_required")
    _refused(client.post(VOICES, content=b'{"name": "x", "speaker": "y"}'), 400, "unsupported_media_type")
    _refused(client.post(VOICES, data=fields, files=upload, headers={"Sec-Fetch-Site": "cross-site"}), 403,
             "cross_origin_refused")
    # with the header, or from the server's own page, the upload reaches the route (which reads the file: 400)
    for headers in ({"X-Requested-With": "x"}, {"Origin": "http://testserver"}, {"Authorization": "Bearer x"}):
        answer = client.post(VOICES, data=fields, files=upload, headers=headers)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "file", (headers, answer.text)


def test_the_allow_list_and_same_origin() -> None:
    guard = BrowserGuard(lambda *a: None, ["https://app.example/"], [VOICES])
    assert guard.trusted("https://app.example", "api.example:8000")
    assert guard.trusted("http://api.example:8000", "api.example:8000")
    for origin in ("http://api.example", "null", "http://[::1", "file://", "https://app.example.evil"):
        assert not guard.trusted(origin, "api.example:8000"), origin
