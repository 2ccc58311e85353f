"""The one preparation between a job and its code requests (Stages.prepare, speech/prepare.py): what it
decides (pieces, refine, step caps, the mel source, the piece limit), that the server's async path reaches the same
code requests as the pipeline's own for the same job, and that serve/ composes none of its steps itself."""
from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest
import torch

from chattts_velocity import InferCodeParams, RefineTextParams
from chattts_velocity.demo import DEMO_MAX_NEW_TOKEN
from chattts_velocity.schema import MAX_NEW_TOKEN, SpeechRequests
from chattts_velocity.speech import SpeechPipeline, SynthesisJob, TextOptions
from chattts_velocity.speech.local_runner import LocalRunner

REPO = Path(__file__).resolve().parents[2]
TEXT = "Hello there. The second sentence is here."
REFINE = RefineTextParams(prompt="[oral_3][break_4]", max_new_token=6, manual_seed=3, show_tqdm=False)


@pytest.fixture(scope="module")
def pipeline(tiny_assets) -> SpeechPipeline:
    return SpeechPipeline.load(tiny_assets, device="cpu", gpt="velocity")


def forced(seed: int = 3) -> InferCodeParams:
    return InferCodeParams(max_new_token=6, min_new_token=6, manual_seed=seed, show_tqdm=False)


def same_requests(a: SpeechRequests, b: SpeechRequests) -> bool:
    return (a.pieces.texts == b.pieces.texts and a.pieces.owner == b.pieces.owner and a.sampling == b.sampling
            and all(torch.equal(x.input_ids, y.input_ids) for x, y in zip(a.prompts, b.prompts, strict=True)))


def test_a_job_without_refine_is_ready_at_once_with_requests_reading_its_mel_source(pipeline) -> None:
    for mel in ("decoder", "dvae"):
        prepared = pipeline.stages.prepare(SynthesisJob([TEXT], forced(), mel=mel))
        assert prepared.pending is None and prepared.mel is pipeline.stages.mel(mel)
        assert prepared.requests is not None and len(prepared.requests.prompts) == 2
        assert all(s.return_hidden == (mel == "decoder") for s in prepared.requests.sampling)


def test_a_job_with_refine_waits_for_its_text_generation_then_builds_its_requests(pipeline) -> None:
    prepared = pipeline.stages.prepare(SynthesisJob([TEXT], forced(), refine=REFINE))
    assert prepared.requests is None and prepared.pending is not None and len(prepared.pending.prompts) == 2
    with pytest.raises(ValueError, match="token_ids"):
        pipeline.stages.refined(prepared, [])
    said = pipeline.stages.frontend.tokenizer.encode("hi")  # any ids the tokenizer reads back
    ready = pipeline.stages.refined(prepared, [torch.tensor(said).view(-1, 1)] * 2)
    assert ready.pending is None and ready.requests is not None and ready.pieces.texts == ["hi", "hi"]
    with pytest.raises(RuntimeError, match="no text generation"):
        pipeline.stages.refined(ready, [])
    only = pipeline.stages.refined(pipeline.stages.prepare(SynthesisJob([TEXT], refine=REFINE, refine_only=True)),
                            [torch.tensor(said).view(-1, 1)] * 2)
    assert only.requests is None and only.refined_texts() == ["hi\nhi"]


def test_the_weights_cap_applies_unless_the_job_brings_its_own_and_the_piece_limit_is_checked(pipeline) -> None:
    default = InferCodeParams(show_tqdm=False)
    assert pipeline.stages.prepare(SynthesisJob([TEXT], default)).params[0].max_new_token == DEMO_MAX_NEW_TOKEN
    own = pipeline.stages.prepare(SynthesisJob([TEXT], default, weights_step_cap=False))
    assert own.params[0].max_new_token == MAX_NEW_TOKEN
    assert own.requests is not None and own.requests.sampling[0].max_new_token == MAX_NEW_TOKEN
    with pytest.raises(ValueError, match="^text: splits into 2 sentence pieces, over the limit of 1"):
        pipeline.stages.prepare(SynthesisJob([TEXT], default, max_pieces=1))
    with pytest.raises(ValueError, match="^text: splits into 2"):
        next(pipeline.synthesis(SynthesisJob([TEXT], [default], max_pieces=1, shape="each")).each())


def test_the_server_and_the_pipeline_prepare_the_same_code_requests_for_the_same_job(pipeline) -> None:
    from chattts_velocity.engine.async_engine import AsyncLLMEngine
    from chattts_velocity.serve.service import SpeechService

    engine = AsyncLLMEngine(pipeline.stages.engine())
    service = SpeechService(pipeline, engine)
    plain = service.job(TEXT, forced())
    refined = service.job(TEXT, forced(), refine=REFINE)
    try:
        served = asyncio.run(service.prepare(plain))
        served_refined = asyncio.run(service.prepare(refined))
    finally:
        engine.shutdown()
        service.shutdown()
    assert plain.texts == [TEXT] and plain.text == TextOptions(None, True, True, True)
    with pipeline.stages.gate.call() as stop:  # the sync path: the refine pass on GPTBackend.generate
        own, own_refined = (LocalRunner().ready(pipeline.synthesis(job), stop) for job in (plain, refined))
    assert served.requests is not None and own.requests is not None
    assert same_requests(served.requests, own.requests)
    assert served_refined.pieces.texts == own_refined.pieces.texts != own.pieces.texts
    assert served_refined.requests is not None and own_refined.requests is not None
    assert same_requests(served_refined.requests, own_refined.requests)
    refined_only = pipeline.synthesis(SynthesisJob([TEXT], refine=REFINE, refine_only=True)).run()
    assert refined_only == ["\n".join(own_refined.pieces.texts)]  # what Chat.infer(refine_text_only=True) gives


# ---- serve/ drives the preparation; it composes none of its steps ------------------------------------------
STEP_ATTRIBUTES = {"code_requests", "refine_requests", "refined_text", "step_capped", "preparer", "per_text",
                   "generate_iter", "_ready", "_stream"}
STEP_NAMES = {"Preparer", "step_capped", "check_piece_count", "stream_texts", "PerTextRequests", "CallGate",
              "normalized_pieces"}


def serve_step_uses(path: Path) -> list[str]:
    """The pipeline steps `path` reaches past Stages.prepare/refined: step methods it calls, step helpers it
    imports, and front-end calls other than the speaker check."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in STEP_ATTRIBUTES:
            found.append(f"{path.name}:{node.lineno} .{node.attr}")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "frontend" and node.attr != "speaker":
            found.append(f"{path.name}:{node.lineno} .frontend.{node.attr}")
        if isinstance(node, ast.ImportFrom):
            found += [f"{path.name}:{node.lineno} imports {a.name}" for a in node.names if a.name in STEP_NAMES]
    return found


def test_serve_reaches_the_pipeline_only_through_prepare_and_refined() -> None:
    assert not [use for path in sorted((REPO / "chattts_velocity" / "serve").glob("*.py"))
                for use in serve_step_uses(path)]


def test_the_step_check_sees_a_composed_step(tmp_path) -> None:
    composed = tmp_path / "composed.py"
    composed.write_text("from ..speech.prepare import step_capped\n"
                        "def f(p, pieces):\n    return p.frontend.pieces(pieces), p.code_requests(pieces, None)\n")
    assert len(serve_step_uses(composed)) == 3
