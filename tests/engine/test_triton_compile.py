"""Every Triton kernel the engine launches compiles for sm_80, sm_89 and sm_90 without a GPU, with no register
spills and within each target's shared memory (devtools/triton_compile_check.py); every layer GEMM with bf16/fp16
weights multiplies on the tensor cores (wgmma on sm_90, mma.sync on sm_80/89) fed by async copies, and with PDL
prefetches its weights before it waits for the previous kernel.

The launches are recorded under Triton's interpreter, then compiled with Triton's bundled ptxas. Results are cached
by a hash of the kernels' sources under the test cache directory: the first run compiles (minutes), later runs read.
In the slow suite for that first run (135 s cold on 2 cores).
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from chattts_velocity.devtools import triton_compile_check as compile_check

pytestmark = pytest.mark.slow

KERNELS = {"_norm_qkv_rope_kernel", "_decode_kernel", "_residual_linear_kernel", "_norm_gate_up_kernel",
           "_prefill_kernel", "_rms_norm_kernel", "_temperature_penalty_kernel", "_top_p_top_k_kernel",
           "_sample_kernel", "_decode_inputs_kernel"}
FUSED = {"_norm_qkv_rope_kernel", "_decode_kernel", "_residual_linear_kernel", "_norm_gate_up_kernel"}
GEMMS = {"_norm_qkv_rope_kernel", "_residual_linear_kernel", "_norm_gate_up_kernel"}
TENSOR_CORE = {"sm_80": "mma", "sm_89": "mma", "sm_90": "wgmma"}


def test_every_engine_kernel_compiles_for_ampere_ada_and_hopper(tmp_path_factory) -> None:
    cache = Path(os.environ.get("CHATTTS_VELOCITY_TEST_CACHE") or tmp_path_factory.mktemp("cache")) / "triton_compile"
    report = compile_check.run(list(compile_check.TARGETS), cache_dir=cache)
    results = report["results"]
    assert {r["kernel"] for r in results} == KERNELS
    assert {r["target"] for r in results} == {"sm_80", "sm_89", "sm_90"}
    assert len(results) == 3 * report["kernels"]
    failed = [f"{r['kernel']} {r['target']} {r['constexprs']}: {r['error']}" for r in results if "error" in r]
    assert not failed, "\n".join(failed)
    dtypes = {p for r in results if r["kernel"] == "_prefill_kernel" for p in r["pointers"].values()}
    assert {"*bf16", "*fp16", "*fp32"} <= dtypes  # the tensor-core tl.dot the interpreter never runs
    assert {r["constexprs"]["BLOCK_SIZE"] for r in results if r["kernel"] == "_decode_kernel"} == {4, 16}
    assert all(0 < r["registers"] <= 255 for r in results)
    for kernel in FUSED:  # the tensor-core GEMMs in bf16 and fp16, and Hopper's launch with PDL
        rows = [r for r in results if r["kernel"] == kernel]
        assert {p for r in rows for p in r["pointers"].values()} >= {"*bf16", "*fp16", "*fp32"}
        assert {(r["target"], r["constexprs"]["USE_PDL"]) for r in rows} == {
            ("sm_80", False), ("sm_89", False), ("sm_90", True)}
    for row in (r for r in results if r["kernel"] in GEMMS):
        name = f"{row['kernel']} {row['target']} {row['constexprs']}"
        if row["pointers"]["w_ptr"] in {"*bf16", "*fp16"}:
            assert row["mma"] == TENSOR_CORE[row["target"]], name
            if row["constexprs"]["K_SPLIT"] > row["constexprs"]["BLOCK_K"]:  # a loop of one chunk has no next one
                assert row["async_copy"] in {"cp.async", "tma"}, name
        assert row["prefetch_before_wait"] is (True if row["target"] == "sm_90" else None), name
    half = {r["pointers"]["w_ptr"] for r in results if r["kernel"] in GEMMS and r["async_copy"] is not None}
    assert half >= {"*bf16", "*fp16"}  # ChatTTS's widths: every K loop of several chunks, pipelined
