"""The one sampling validator (schema.check_sampling) behind RefineTextParams, InferCodeParams, SamplingParams
and the export plan's seeds: every bad value is a ValueError that starts with the field as the caller spells it.
The step caps' defaults and the "prompt fits" rule (schema.check_prompt_fits), each decided in schema.py alone."""
from __future__ import annotations

import math

import numpy as np
import pytest

from chattts_velocity.export import plan_export
from chattts_velocity.params import InferCodeParams, RefineTextParams
from chattts_velocity.schema import (
    MAX_NEW_TOKEN,
    MIN_TEMPERATURE,
    REFINE_MAX_NEW_TOKEN,
    SEED_MAX,
    TOP_K_MAX,
    SamplingParams,
    check_prompt_fits,
    check_sampling,
)

NAN, INF = math.nan, math.inf
# SamplingParams' name -> values every entry point must refuse
BAD = {
    "temperature": [0, 0.0, -1.0, NAN, INF, -INF, 1e-45, MIN_TEMPERATURE / 2, True, "0.3", None, [], [0.3, NAN],
                    (0.3, 0.0), 10**400],
    "top_p": [0, 0.0, -0.1, 1.0000001, 1.5, NAN, INF, True, "0.7"],
    "top_k": [0, -1, TOP_K_MAX + 1, 2**63, 1.5, 20.0, True, NAN, "20"],
    "repetition_penalty": [0, -1.0, NAN, INF, True, None, "1.05"],
    "max_new_token": [0, -1, 1.5, True, None, NAN],
    "min_new_token": [-1, 1.5, True, None, NAN],
    "seed": [-1, SEED_MAX + 1, 2**70, True, False, 1.0, "1", NAN],
}
# values every entry point must accept (edges included)
GOOD = {
    "temperature": [1e-6, MIN_TEMPERATURE, 1, 5.0, [0.1, 0.2, 0.3, 0.4], (0.3,), np.float32(0.3)],
    "top_p": [1, 1.0, 1e-9, None, np.float64(0.5)],
    "top_k": [1, 20, 10**6, TOP_K_MAX, None, np.int64(5)],  # above the vocabulary: clamped at use
    "repetition_penalty": [1e-3, 1, 1.05, 100.0],
    "max_new_token": [1, 2048, np.int32(7)],
    "min_new_token": [0, 1],
    "seed": [0, 1, SEED_MAX, None, np.int64(3)],
}
UPSTREAM = {"top_p": "top_P", "top_k": "top_K", "seed": "manual_seed"}
CLASSES = [(InferCodeParams, UPSTREAM), (RefineTextParams, UPSTREAM), (SamplingParams, {})]


def _cases(table: dict[str, list]) -> list:
    return [pytest.param(cls, spelled, name, value, id=f"{cls.__name__}-{name}-{value!r}"[:80])
            for cls, spelled in CLASSES for name, values in table.items() for value in values]


@pytest.mark.parametrize("cls, spelled, name, value", _cases(BAD))
def test_a_bad_value_is_a_value_error_naming_the_callers_field(cls, spelled, name, value) -> None:
    field = spelled.get(name, name)
    with pytest.raises(ValueError) as err:
        cls(**{field: value})
    assert str(err.value).startswith(f"{field}: "), str(err.value)


@pytest.mark.parametrize("cls, spelled, name, value", _cases(GOOD))
def test_good_edge_values_pass(cls, spelled, name, value) -> None:
    field = spelled.get(name, name)
    params = cls(**{field: value})
    assert getattr(params, field) is value


@pytest.mark.parametrize("cls, spelled", CLASSES)
def test_min_new_token_above_max_new_token_names_min_new_token(cls, spelled) -> None:
    with pytest.raises(ValueError, match=r"^min_new_token: must be <= max_new_token \(4\), got 5"):
        cls(max_new_token=4, min_new_token=5)
    assert cls(max_new_token=4, min_new_token=4).min_new_token == 4


@pytest.mark.parametrize("value", [-1, 1.5, True, None])
def test_penalty_window_is_checked_too(value) -> None:
    with pytest.raises(ValueError, match="^penalty_window: "):
        SamplingParams(penalty_window=value)


def test_the_callers_spelling_is_used_and_absent_fields_are_not_checked() -> None:
    with pytest.raises(ValueError, match="^max_new_tokens: "):
        check_sampling({"max_new_token": 0}, {"max_new_token": "max_new_tokens"})
    check_sampling({})
    check_sampling({"seed": None, "top_k": None})


def test_to_sampling_params_carries_every_checked_value() -> None:
    p = InferCodeParams(temperature=[0.1, 0.2, 0.3, 0.4], top_P=0.9, top_K=7, repetition_penalty=1.2,
                        max_new_token=30, min_new_token=3, manual_seed=SEED_MAX)
    s = p.to_sampling_params("code", 625, return_hidden=True)
    assert (s.temperature, s.top_p, s.top_k, s.repetition_penalty) == ((0.1, 0.2, 0.3, 0.4), 0.9, 7, 1.2)
    assert (s.max_new_token, s.min_new_token, s.seed, s.eos_token_id) == (30, 3, SEED_MAX, 625)


@pytest.mark.parametrize("value", [-1, SEED_MAX + 1, 2**70, True, "7", 1.5])
def test_export_seeds_follow_the_same_rule(tmp_path, value) -> None:
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"text": "Hello.", "seed": %s}\n' % ("true" if value is True else repr(value).replace("'", '"')))
    plan = plan_export(lines, tmp_path / "out")
    assert plan.lines[0].status == "error" and plan.lines[0].error.startswith("seed: ")
    with pytest.raises(ValueError, match="^seed: "):
        plan_export(lines, tmp_path / "out", seed=value)


def test_export_seed_base_may_reach_the_largest_seed_but_not_pass_it(tmp_path) -> None:
    lines = tmp_path / "in.txt"
    lines.write_text("One.\nTwo.\n")
    plan = plan_export(lines, tmp_path / "out", seed=SEED_MAX - 1)
    assert [line.seed for line in plan.lines] == [SEED_MAX - 1, SEED_MAX]
    with pytest.raises(ValueError, match=r"^seed \+ line number: "):
        plan_export(lines, tmp_path / "out", seed=SEED_MAX)


def test_every_default_step_cap_is_the_schemas_constant_itself(tmp_path) -> None:
    """One default per cap: a second literal 2048 or 384 anywhere would be an int object of its own."""
    from chattts_velocity.demo import default_max_new_token

    assert SamplingParams.max_new_token is MAX_NEW_TOKEN and InferCodeParams.max_new_token is MAX_NEW_TOKEN
    assert default_max_new_token(tmp_path) is MAX_NEW_TOKEN  # not demo weights: the library's default
    assert RefineTextParams.max_new_token is REFINE_MAX_NEW_TOKEN


def test_the_servers_default_step_cap_is_the_librarys() -> None:
    pytest.importorskip("fastapi")
    from chattts_velocity.serve.server_config import ServerConfig

    assert ServerConfig().max_new_token is MAX_NEW_TOKEN


def test_a_prompt_fits_while_its_steps_stay_within_the_limit() -> None:
    check_prompt_fits(4000, 96, 4096, "max_model_len")  # exactly full
    with pytest.raises(ValueError, match=r"^max_new_token: the prompt \(4000 positions\) \+ max_new_token \(97\) = "
                                         r"4097 exceeds max_model_len \(4096\)"):
        check_prompt_fits(4000, 97, 4096, "max_model_len")
