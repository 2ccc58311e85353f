"""The speech request's sampling fields go through the one validator (no pydantic coercion first): hostile JSON
values are a 400 naming the body's field before any work; good ones become InferCodeParams keywords."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")

from chattts_velocity.params import InferCodeParams
from chattts_velocity.schema import SEED_MAX
from chattts_velocity.serve.openai_api import SpeechBody, bad_request, sampling_kwargs

CAP = 100
HOSTILE = [  # raw JSON, as a client may send it
    ('"temperature": NaN', "temperature"), ('"temperature": Infinity', "temperature"),
    ('"temperature": 1e-45', "temperature"), ('"temperature": true', "temperature"),
    ('"temperature": 0', "temperature"),
    ('"top_p": NaN', "top_p"), ('"top_p": 1.5', "top_p"), ('"top_p": "0.5"', "top_p"),
    ('"top_k": 9223372036854775808', "top_k"), ('"top_k": true', "top_k"), ('"top_k": 2.5', "top_k"),
    ('"seed": -1', "seed"), ('"seed": 9223372036854775808', "seed"), ('"seed": true', "seed"), ('"seed": "5"', "seed"),
    ('"seed": 1180591620717411303424', "seed"),
    ('"max_new_tokens": 0', "max_new_tokens"), ('"max_new_tokens": 101', "max_new_tokens"),
    ('"max_new_tokens": true', "max_new_tokens"), ('"min_new_tokens": -1', "min_new_tokens"),
    ('"min_new_tokens": 101', "min_new_tokens"), ('"max_new_tokens": 10, "min_new_tokens": 11', "min_new_tokens"),
]


def _body(fields: str) -> SpeechBody:
    return SpeechBody.model_validate(json.loads('{"input": "Hi.", ' + fields + "}"))


@pytest.mark.parametrize("fields, param", HOSTILE)
def test_hostile_sampling_values_are_a_400_naming_the_body_field(fields: str, param: str) -> None:
    with pytest.raises(ValueError) as err:
        sampling_kwargs(_body(fields), CAP)
    assert str(err.value).startswith(f"{param}: ")
    error = bad_request(err.value)
    assert error.status_code == 400 and error.detail["param"] == param


def test_good_values_become_infer_code_params_keywords() -> None:
    body = _body(f'"temperature": 1e-6, "top_p": 1, "top_k": 2147483647, "seed": {SEED_MAX}, '
                 '"max_new_tokens": 100, "min_new_tokens": 100')
    kwargs = sampling_kwargs(body, CAP)
    assert kwargs == {"temperature": 1e-6, "top_P": 1, "top_K": 2147483647, "manual_seed": SEED_MAX,
                      "max_new_token": 100, "min_new_token": 100}
    assert InferCodeParams(**kwargs).manual_seed == SEED_MAX
    assert sampling_kwargs(_body('"seed": null'), CAP) == {"max_new_token": CAP}  # unset: defaults, server cap

