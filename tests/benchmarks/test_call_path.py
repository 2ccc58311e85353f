"""benchmarks/call_path.py: the counting of stays and returns, and one traced ModelRunner.run of this tree."""
from __future__ import annotations

from pathlib import Path

from benchmarks import call_path

REPO = Path(__file__).resolve().parents[2]


def test_a_return_is_a_stay_in_a_place_already_left() -> None:
    path = ["a", "a", "b", "a", "c", "b", "b"]
    assert call_path.stays(path) == ["a", "b", "a", "c", "b"]
    assert call_path.returns(path) == 2  # back to a, back to b


def test_rooms_are_engines_top_level_folders() -> None:
    assert call_path.room("chattts_velocity.engine.worker.sampling.sampler") == "chattts_velocity.engine.worker"
    assert call_path.room("chattts_velocity.engine.llm_engine") == "chattts_velocity.engine"
    assert call_path.room("chattts_velocity.model.layers") == "chattts_velocity.model"
    assert call_path.folder("chattts_velocity.engine.worker.sampling.sampler") == \
        "chattts_velocity.engine.worker.sampling"


def test_the_traced_step_starts_and_ends_in_the_model_runner(tiny_assets: Path) -> None:
    visits = call_path.trace(REPO, str(tiny_assets))
    assert visits[0] == visits[-1] == "chattts_velocity.engine.worker.model_runner"
    report = call_path.summary(visits)
    assert {"chattts_velocity.engine.worker", "chattts_velocity.engine.sched", "chattts_velocity.model"} == \
        set(report["room"]["path"])  # the worker reads only the scheduler's hand-off types and runs the model
