"""Upstream's ensure_non_empty, bounded (engine/sched/retry.py): only an unseeded request that ended empty at EOS runs
again, at most MAX_REGENERATE times; the engine queues it under the same request id."""
from __future__ import annotations

from fakes import make_prompt

from chattts_velocity.engine.sched.retry import RetryOnEmpty
from chattts_velocity.engine.sched.sequence import Sequence, SequenceStatus
from chattts_velocity.schema import MAX_REGENERATE, SamplingParams


def _ended(status: SequenceStatus = SequenceStatus.FINISHED_EOS, generated: int = 0, **params) -> Sequence:
    seq = Sequence("req", make_prompt(5), SamplingParams(**params), arrival=3.0)
    for _ in range(generated):
        seq.append_token((1, 2, 3, 4), None)
    seq.status = status
    return seq


def test_an_unseeded_request_empty_at_eos_runs_again_as_a_fresh_sequence() -> None:
    seq = _ended()
    again = RetryOnEmpty().again(seq)
    assert again is not None and again is not seq
    assert (again.request_id, again.prompt, again.params, again.arrival) == ("req", seq.prompt, seq.params, 3.0)
    assert again.status is SequenceStatus.WAITING and again.num_generated == 0


def test_it_stops_after_the_limit_and_forgets_the_request() -> None:
    retries = RetryOnEmpty()
    assert all(retries.again(_ended()) is not None for _ in range(MAX_REGENERATE))
    assert retries.again(_ended()) is None
    assert retries.tries == {}  # the count went with the request: a later request of the same id starts afresh
    assert retries.again(_ended()) is not None


def test_what_is_never_retried() -> None:
    retries = RetryOnEmpty()
    assert retries.again(_ended(seed=7)) is None  # seeded: it would repeat itself
    assert retries.again(_ended(ensure_non_empty=False)) is None
    assert retries.again(_ended(generated=1)) is None  # not empty
    assert retries.again(_ended(SequenceStatus.FINISHED_LENGTH)) is None
    assert retries.again(_ended(SequenceStatus.FINISHED_ABORTED)) is None
    assert retries.tries == {}


def test_an_aborted_request_is_forgotten() -> None:
    retries = RetryOnEmpty()
    retries.again(_ended())
    retries.forget("req")
    assert retries.tries == {}
