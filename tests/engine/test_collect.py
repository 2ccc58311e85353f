"""Collectors (engine/collect.py) take steady blocks as a whole and give what per-request deltas give."""
from __future__ import annotations

import numpy as np
import torch

from chattts_velocity.engine.collect import Collector, Collectors
from chattts_velocity.engine.sched.step import SteadyRows, StepDeltas
from chattts_velocity.schema import GenerationOutput

H = 3


def _steps() -> list[StepDeltas]:
    """Three requests on one persistent batch for 3 steps ("b" keeps no hidden states, "x" is another consumer's);
    "a" ends at EOS with the third (its row is not in the block), then a general step ends "b" by length."""
    ids = ["a", "b", "x"]
    steps = []
    for k in range(3):
        tokens = torch.arange(12).view(3, 4) + 100 * k
        hidden = torch.arange(9, dtype=torch.float32).view(3, H) + 10 * k
        live = np.array([k < 2, True, True])
        block = SteadyRows(ids, tokens, hidden, np.array([True, False, True]), np.array([k + 1] * 3),
                           None if live.all() else live)
        ended = [] if live.all() else [(0, GenerationOutput("a", tokens[:0], None, True, "eos"))]
        steps.append(StepDeltas(block, ended))
    last = GenerationOutput("b", torch.full((1, 4), 7), None, True, "length")
    steps.append(StepDeltas(others=[last]))
    return steps


def _one_by_one(steps: list[StepDeltas]) -> dict[str, GenerationOutput]:
    collected = {"a": Collector("a", H), "b": Collector("b", None)}
    for step in steps:
        for delta in step.outputs():
            if delta.request_id in collected:
                collected[delta.request_id].add(delta)
    return {rid: c.output() for rid, c in collected.items()}


def test_blocks_taken_whole_give_what_the_deltas_give() -> None:
    collectors = Collectors()
    collectors.add("a", H)
    collectors.add("b", None)
    finished, rows = [], 0
    for step in _steps():
        new, done = collectors.take(step)
        rows, finished = rows + new, finished + done
    expected = _one_by_one(_steps())
    assert finished == ["a", "b"] and rows == 2 + 3 + 1
    for rid, want in expected.items():
        got = collectors.by_id[rid].output()
        assert torch.equal(got.token_ids, want.token_ids), rid
        assert (got.hidden is None) == (want.hidden is None) and (got.hidden is None or torch.equal(got.hidden,
                                                                                                   want.hidden))
        assert (got.finished, got.finish_reason) == (want.finished, want.finish_reason)
    assert expected["a"].token_ids.shape == (2, 4) and expected["a"].hidden.shape == (2, H)  # type: ignore[union-attr]
    assert expected["b"].hidden is None and expected["b"].token_ids.shape == (4, 4)


def test_step_outputs_keep_the_batch_order() -> None:
    step = _steps()[2]
    assert [d.request_id for d in step.outputs()] == ["a", "b", "x"]
    assert step.outputs()[0].finish_reason == "eos" and step.outputs()[1].hidden is None
    assert torch.equal(step.outputs()[2].hidden, step.steady.hidden[2:3])  # type: ignore[union-attr]
