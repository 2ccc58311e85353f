"""One Precision from load to log: the pipeline decides it once (auto and the CPU's bf16 included) and the engine,
its log line and the audio decode read that same object."""
from __future__ import annotations

import logging

import pytest
import torch

from chattts_velocity.model import kernels
from chattts_velocity.speech.pipeline import SpeechPipeline


@pytest.fixture
def native_bf16_host(monkeypatch):
    """A CPU that computes bf16 natively (AVX-512 BF16 / AMX), as far as every decision reads it."""
    monkeypatch.setattr(kernels, "native_bf16", lambda: True)


def test_the_engine_runs_the_pipelines_precision_and_logs_it(tiny_assets, native_bf16_host, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="chattts_velocity"):
        pipeline = SpeechPipeline.load(tiny_assets, device="cpu", gpt="velocity", dtype="bfloat16", backend="torch")
    engine_precision = pipeline.stages.engine().engine_config.precision
    assert engine_precision is pipeline.precision
    assert pipeline.precision.audio == torch.bfloat16  # the CPU's native bf16 reached the decision
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("precision ")]
    assert logged == [pipeline.precision.describe()] and "audio decode bfloat16" in logged[0]
    pipeline.shutdown()


def test_auto_is_resolved_once_when_the_pipeline_loads(tiny_assets, monkeypatch) -> None:
    monkeypatch.setattr(kernels, "unsupported", lambda: "no kernels on this host")
    pipeline = SpeechPipeline.load(tiny_assets, device="cpu", gpt="velocity", dtype="auto")
    assert pipeline.precision.dtype == pipeline.dtype == "float32"  # no C++ kernels: exact float32
    assert pipeline.stages.engine().engine_config.precision is pipeline.precision
    pipeline.shutdown()


def test_a_bad_dtype_is_one_value_error_naming_dtype(tiny_assets) -> None:
    with pytest.raises(ValueError, match="dtype"):
        SpeechPipeline.load(tiny_assets, device="cpu", gpt="velocity", dtype="float8")
