"""Every numeric field of the speech body, given a value no float holds (a 310-digit JSON integer, 1e309 as a
float literal, which Python reads as inf), is a 400 naming the field, never a 500."""
from __future__ import annotations

import pytest

FIELDS = {"loudness": "loudness", "speed": "speed", "temperature": "temperature", "top_p": "top_p",
          "top_k": "top_k", "seed": "seed", "max_new_tokens": "max_new_tokens", "min_new_tokens": "min_new_tokens",
          "voice": "voice"}
HUGE = "1" + "0" * 309  # 1e309 as an integer literal: float() of it overflows


@pytest.mark.parametrize("field", sorted(FIELDS))
@pytest.mark.parametrize("literal", [HUGE, "-" + HUGE, "1e309", "-1e309"])
def test_an_out_of_range_number_is_a_400_naming_its_field(client, field: str, literal: str) -> None:
    body = '{"input": "Hello there.", "response_format": "wav", "' + field + '": ' + literal + "}"
    answer = client.post("/v1/audio/speech", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["param"] == FIELDS[field] and error["message"].startswith(f"{FIELDS[field]}: "), error
