"""benchmarks/bench_cpu.py --quick on tiny weights: the JSON holds every field and target (no speeds
asserted: only that each was measured, and that the default stream's first chunk matches the whole clip)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from safetensors import safe_open

from benchmarks import bench_cpu
from chattts_velocity.config import ModelConfig
from chattts_velocity.model import kernels

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # one bench_cpu --quick run: about a minute on a quiet 2-core host


@pytest.fixture(scope="module")
def report(tiny_assets, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench")
    bench_cpu.main(["--model", str(tiny_assets), "--quick", "--no-llamacpp", "--out", str(out),
                    "--host-kind", "test-kind"])
    return json.loads((out / "cpu_test-kind_quick.json").read_text(encoding="utf-8"))


def test_host_probes_and_raw_measurements(report: dict) -> None:
    assert report["cpu"]["model"] and isinstance(report["cpu"]["flags"], list) and report["cpu"]["host_kind"]
    for probes in (report["probes"], report["probes_after"]):
        assert probes["read_gbps"] > 0 and probes["bf16_gemm_gflops"] > 0
    probes = (report["probes"], report["probes_after"])
    for key in ("read_gbps", "bf16_gemm_gflops"):
        assert report["ceilings"][key] == max(p[key] for p in probes)
    fp32 = max(p["contention"]["gflops_all_threads"] for p in probes)  # the compute ceiling where bf16 GEMMs crawl
    assert report["ceilings"]["gemm_gflops"] == max(report["ceilings"]["bf16_gemm_gflops"], fp32) > 0
    for dtype in ("bfloat16", "int8"):
        measured = report["measured"][dtype]
        assert measured["one_stream_steps_per_s"] > 0
        for n in ("32", "64"):
            batch = measured["batch"][n]
            assert batch["concurrency"] == int(n) and 0 < batch["decode_share"] < 1
    assert set(report["measured"]["streams"]) == set(bench_cpu.STREAM_SETTINGS)
    for stream in report["measured"]["streams"].values():
        assert 0 < stream["ttfa_alone_s"] and 0 < stream["ttfa_among_16_s"]
        assert math.isfinite(stream["first_chunk_error"])
    assert report["measured"]["streams"]["default"]["first_chunk_error"] <= 1e-4


def test_each_precision_profiles_chat_infer_per_stage(report: dict) -> None:
    from benchmarks.lib.public import STAGES

    for dtype in bench_cpu.DTYPES:
        stages = report["measured"][dtype]["stages"]
        assert list(stages) == [str(n) for n in bench_cpu.QUICK["profile_sizes"]]
        for n, run in stages.items():
            seconds = run["seconds"]
            assert set(seconds) == {*STAGES, "python"} and run["concurrency"] == int(n)
            assert all(seconds[stage] > 0 for stage in STAGES) and math.isclose(sum(seconds.values()), run["wall_s"])
            assert run["calls"]["gpt_prefill"] >= 1 and run["calls"]["gpt_decode"] >= 1 and run["calls"]["decoder"] >= 1
            assert math.isclose(sum(run["share"].values()), 1.0) and 0 < run["non_gpt_share"] < 1
            assert run["audio_s"] > 0


def test_the_stage_clock_times_the_outer_call_once_and_undoes_its_wrappers() -> None:
    from benchmarks.lib.public import StageClock

    class Model:
        def forward(self, x: int) -> int:
            return x + 1

        def decode_rows(self, x: int) -> int:
            return self.forward(x) * 2  # a timed call inside a timed call

    model, clock = Model(), StageClock()
    clock.wrap(model, "forward", "decoder")
    clock.wrap(model, "decode_rows", "vocos")
    clock.wrap(model, "absent", "vocos")
    assert model.decode_rows(1) == 4 and model.forward(1) == 2
    assert clock.calls["vocos"] == 1 and clock.calls["decoder"] == 1
    clock.undo()
    assert "forward" not in vars(model) and "decode_rows" not in vars(model)


def test_every_target_is_reported(report: dict) -> None:
    labels = [t["target"] for t in report["targets"]]
    for number in ("0:", "1: one int8", "1: one bfloat16", "2:", "3: int8 / bf16 end to end at 32",
                   "3: int8 / bf16 end to end at 64", "5: default stream first audio alone",
                   "5: default stream first audio among 16", "5: default first chunk", "6:",
                   "4: a seeded text's codes alone == among 8 and among 16 (bfloat16)",
                   "4: a seeded text's codes alone == among 8 and among 16 (int8)", "7:"):
        assert sum(label.startswith(number) for label in labels) == 1, number
    for item in report["targets"]:
        assert isinstance(item["met"], bool)
        if item["measured"] is None:
            assert item["skipped"] == "--no-llamacpp" or _int8_kv_cannot_run(item)
        else:
            assert item["measured"] >= 0
    for dtype in ("bfloat16", "int8"):
        assert set(report["measured"]["seeds"][dtype]) == {"among_8", "among_16"}


def _int8_kv_cannot_run(item: dict) -> bool:
    """Target 7 needs the int8 KV cache: tiny weights (head_dim 16) have none, and neither has a host where the
    C++ kernels cannot run (the reason is the one kernels.unsupported() gives)."""
    if not item["target"].startswith("7:"):
        return False
    reason = kernels.unsupported()
    return "head_dim" in item["skipped"] or (reason is not None and reason in item["skipped"])


def test_weight_bytes_count_the_checkpoint(tiny_assets) -> None:
    """The bytes-per-step formula against the tiny checkpoint's own linear weights."""
    config = ModelConfig.from_json(tiny_assets / "asset" / "gpt" / "config.json")
    with safe_open(tiny_assets / "asset" / "gpt" / "model.safetensors", "pt") as f:
        linear = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys() if k.endswith("proj.weight"))
    counted = bench_cpu.weight_bytes_per_step(config)
    heads = config.num_vq * config.num_audio_tokens * config.hidden_size
    assert counted["linear_params"] == linear
    assert counted["bfloat16"] == 2 * linear + 4 * heads and counted["int8"] == linear + 4 * heads
