"""The pipeline's use cases on tiny random weights: a SynthesisJob through run, each and stream, the one call
gate, interruption and the step cap. These are what Chat, the page and the export call."""
from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from chattts_velocity import InferCodeParams, RefineTextParams
from chattts_velocity.speech import SpeechPipeline, SynthesisJob, TextOptions

STEPS = 6
TEXTS = ["Hello there.", "The second text is here."]


@pytest.fixture(scope="module")
def pipeline(tiny_assets) -> SpeechPipeline:
    return SpeechPipeline.load(tiny_assets, device="cpu", gpt="velocity")


def forced(seed: int = 3, steps: int = STEPS) -> InferCodeParams:
    return InferCodeParams(max_new_token=steps, min_new_token=steps, manual_seed=seed, show_tqdm=False)


def test_run_gives_one_waveform_per_text_and_stream_gives_the_same_audio(pipeline) -> None:
    job = SynthesisJob(TEXTS, forced(), text=TextOptions(split=False))
    waves = pipeline.synthesis(job).run()
    assert len(waves) == 2 and all(w.dtype == np.float32 and len(w) == (2 * STEPS - 1) * 256 for w in waves)
    chunks = list(pipeline.synthesis(dataclasses.replace(job, shape="chunks")).stream())
    streamed = [np.concatenate([c[i] for c in chunks]) for i in range(2)]
    for whole, parts in zip(waves, streamed, strict=True):
        np.testing.assert_allclose(parts, whole, atol=1e-5)


def test_run_with_refine_only_gives_the_refined_texts(pipeline) -> None:
    refine = RefineTextParams(max_new_token=4, min_new_token=4, manual_seed=1, show_tqdm=False)
    refined = pipeline.synthesis(SynthesisJob(TEXTS, refine=refine, refine_only=True)).run()
    assert len(refined) == 2 and all(isinstance(t, str) for t in refined)


def test_each_gives_each_text_its_own_params_and_a_bad_text_fails_alone(pipeline) -> None:
    params = [forced(seed=1), InferCodeParams(spk_emb="not a speaker", show_tqdm=False), forced(seed=2)]
    results = dict(pipeline.synthesis(SynthesisJob(["One.", "Two.", "Three."], params, shape="each")).each())
    assert isinstance(results[1], ValueError) and "spk_emb" in str(results[1])
    assert len(results[0]) == len(results[2]) == (2 * STEPS - 1) * 256
    alone = pipeline.synthesis(SynthesisJob(["Three."], forced(seed=2))).run()[0]
    np.testing.assert_array_equal(results[2], alone)  # the same seed alone and among others (float32)


def test_a_job_states_its_shape_before_any_work() -> None:
    with pytest.raises(ValueError, match="refine_only"):
        SynthesisJob(TEXTS, refine_only=True)
    with pytest.raises(ValueError, match="params"):
        SynthesisJob(TEXTS, [forced()])
    assert SynthesisJob("One text.").texts == ["One text."]


def test_each_and_stream_refuse_what_they_cannot_do(pipeline) -> None:
    refine = RefineTextParams(show_tqdm=False)
    with pytest.raises(ValueError, match="^refine: shape 'each' has no refine pass"):
        SynthesisJob(TEXTS, refine=refine, shape="each")
    with pytest.raises(ValueError, match="^shape: each\\(\\) is the verb of shape 'each' jobs"):
        pipeline.synthesis(SynthesisJob(TEXTS, forced())).each()
    with pytest.raises(ValueError, match="^shape: a job of shape 'each' gives its results through each"):
        pipeline.synthesis(SynthesisJob(TEXTS, forced(), shape="each")).run()
    with pytest.raises(ValueError, match="refine_only"):
        pipeline.synthesis(SynthesisJob(TEXTS, refine=refine, refine_only=True)).stream()


def test_the_callers_stop_flag_and_interrupt_end_a_call_early(pipeline) -> None:
    stop = threading.Event()
    stop.set()
    short = pipeline.synthesis(SynthesisJob(["Stopped."], forced(steps=40), stop=stop.is_set)).run()[0]
    assert len(short) < (2 * 40 - 1) * 256
    entered = threading.Event()

    def running() -> list:
        entered.set()
        return pipeline.synthesis(SynthesisJob(["Interrupted."], forced(steps=400))).run()

    result: list = []
    worker = threading.Thread(target=lambda: result.extend(running()))
    worker.start()
    assert entered.wait(30)
    while pipeline.stages.gate.in_flight < 1:
        threading.Event().wait(0.01)
    pipeline.interrupt()
    worker.join(60)
    assert not worker.is_alive() and len(result[0]) < (2 * 400 - 1) * 256
    after = pipeline.synthesis(SynthesisJob(["After."], forced())).run()[0]  # a later call is not affected
    assert len(after) == (2 * STEPS - 1) * 256


def test_demo_weights_cap_the_steps_a_job_leaves_at_the_default(pipeline) -> None:
    from chattts_velocity.demo import DEMO_MAX_NEW_TOKEN

    (capped,) = pipeline.stages.step_capped([InferCodeParams()])
    assert capped.max_new_token == DEMO_MAX_NEW_TOKEN


def test_the_pipelines_public_surface_is_its_use_cases() -> None:
    """At most six public methods (properties and attributes aside); the steps live on its stages."""
    methods = {name for name, value in vars(SpeechPipeline).items()
               if not name.startswith("_") and not isinstance(value, property)}
    assert methods == {"load", "synthesis", "interrupt", "shutdown"}


def test_no_job_pipeline_or_server_code_speaks_of_use_vllm() -> None:
    """Only Chat's upstream surface (and the CLI over it) says use_vllm: a job names its GPT path."""
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "chattts_velocity"
    paths = [path for folder in ("speech", "serve") for path in sorted((package / folder).glob("*.py"))]
    said = [f"{path.relative_to(package)}:{i}" for path in paths
            for i, line in enumerate(path.read_text().splitlines(), 1) if "use_vllm" in line]
    assert said == []
