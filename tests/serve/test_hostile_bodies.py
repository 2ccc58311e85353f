"""Bodies a hostile client sends, checked without a server: JSON the edge refuses, the `param` of every 400,
booleans that are not numbers, seeds written in other digits."""
from __future__ import annotations

from collections.abc import Callable

import pytest

from chattts_velocity.schema import check_prompt_fits
from chattts_velocity.serve.edge import json_problem
from chattts_velocity.serve.request import bad_request
from chattts_velocity.serve.voice_fields import speed_prompt
from chattts_velocity.text import EmptyText
from chattts_velocity.text.budget import TextBudgetExceeded
from chattts_velocity.text.voices import voice_params


@pytest.mark.parametrize("body, problem", [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"seed": ' + b"9" * 5001 + b"}", "an integer of 5001 digits; at most 1000"),
    (b'{"input": "unterminated', "Unterminated string"),
    (b"\xff\xfe", "Expecting value"),
])
def test_unreadable_json_is_named(body: bytes, problem: str) -> None:
    assert problem in json_problem(body)


@pytest.mark.parametrize("body", [b"", b'{"input": "hi", "seed": ' + b"9" * 400 + b"}", b"[[[[1]]]]"])
def test_readable_json_passes_to_the_field_checks(body: bytes) -> None:
    assert json_problem(body) is None


def raised(check: Callable[[], None]) -> ValueError:
    try:
        check()
    except ValueError as exc:
        return exc
    raise AssertionError("expected a ValueError")


@pytest.mark.parametrize("error, param, code", [
    (raised(lambda: check_prompt_fits(4100, 4, 4096, "max_model_len")), "input", None),  # the engines' own error
    (ValueError("max_new_token: must be >= 1"), "max_new_tokens", None),
    (ValueError("text: 200000 characters is over the limit"), "input", None),
    (ValueError("spk_smp: the codes are [1000, 65535]"), "voice", None),
    (EmptyText("text[0]: holds nothing to say once normalised"), "input", "empty_input"),
    (TextBudgetExceeded("input: preparing the text took over its budget"), "input", "input_too_complex"),
])
def test_every_400_names_the_body_field(error: ValueError, param: str, code: str | None) -> None:
    detail = bad_request(error).detail
    assert (detail["param"], detail["code"]) == (param, code)


@pytest.mark.parametrize("speed", [True, False, "1.0", None])
def test_booleans_and_strings_are_not_speeds(speed: object) -> None:
    with pytest.raises(ValueError, match="^speed: must be a number"):
        speed_prompt(speed)


@pytest.mark.parametrize("voice, message", [("²", "unknown voice"), ("٣", "unknown voice"),
                                            ("9" * 10_000, "a seed must be in 0..4294967295, got 10000 digits")])
def test_seeds_are_ascii_digits_of_a_sane_length(voice: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"^voice: {message}"):
        voice_params(voice, None, lambda seed: pytest.fail("no seed to draw"))


def test_seeded_voices_drawn_on_many_threads_are_the_voices_of_their_seeds() -> None:
    """Preset and seed voices are resolved on text threads while other threads use torch's global RNG: each must
    still be the speaker torch.manual_seed(seed) gives (a shared-RNG draw raced and gave other voices)."""
    import threading

    import torch

    from chattts_velocity.serve.voice_fields import VoiceBook
    from chattts_velocity.text import sample_random_speaker, seed_context

    def expected(seed: int) -> str:
        with seed_context(seed):
            return sample_random_speaker(64)

    book = VoiceBook(lambda seed: sample_random_speaker(64, seed=seed))
    stop, got = threading.Event(), {}

    def noise() -> None:  # another thread drawing from the global RNG all the while
        while not stop.is_set():
            torch.manual_seed(12345)
            torch.randn(64)

    def resolve(seed: int) -> None:
        got[seed] = book.for_seed(seed)

    spinner = threading.Thread(target=noise)
    spinner.start()
    try:
        workers = [threading.Thread(target=resolve, args=(seed,)) for seed in range(40)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        stop.set()
        spinner.join()
    assert all(got[seed] == expected(seed) for seed in range(40))
