#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU, at most 8 minutes on an H100/H200: the GPU- and Triton-marked tests
# on CUDA (<= 140 s), then benchmarks/gpu_check.py (<= 230 s) at a TTS request's shape (the default max_model_len,
# prompts of 100-300 positions, decode timed at contexts ~300-600): steady and end-to-end decode at 1/16/64/256
# sequences (256 at once), old vs new replay time, kernels per step, a seeded request alone vs among 63 others (also
# in the overlapped loop), each layer GEMM's achieved TB/s, 64 streaming clients; then
# benchmarks/profile_gpu_kernels.py (<= 100 s): device time per kernel, GEMM TB/s, decode attention per split
# length, GEMM tiles x split-K targets. Every part has its own time limit and is saved as it ends; a step that fails
# or times out never stops the next. Writes gpu_check.json and profile_gpu_kernels.json into $RESULTS (default
# benchmarks/results; docs/gpu.md).
#   bash benchmarks/gpu_check.sh [gpu_check.py options]      # python -m benchmarks.gpu_check --help
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
unset TRITON_INTERPRET
RESULTS="${RESULTS:-benchmarks/results}"
mkdir -p "$RESULTS"
"$PYTHON" -c "import torch, triton; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__)"
JUNIT="$(mktemp --suffix=.xml)"
timeout 140 "$PYTHON" -m pytest -q -p no:cacheprovider -m "gpu or triton" --junitxml="$JUNIT" \
    tests/model/test_triton_kernels.py tests/engine/test_triton_backend.py tests/engine/test_device_sampler.py \
    tests/engine/test_sync.py tests/engine/test_warm_up.py tests/audio/test_gpu_decode.py \
    tests/audio/test_chunk_plan.py tests/model/test_triton_layer_kernels.py tests/model/test_split_k.py \
    tests/model/test_top_p_top_k.py || true
timeout 230 "$PYTHON" -m benchmarks.gpu_check --device cuda --model demo --tests "$JUNIT" \
    --out "$RESULTS/gpu_check.json" "$@" || true
rm -f "$JUNIT"
timeout 100 "$PYTHON" -m benchmarks.profile_gpu_kernels --out "$RESULTS/profile_gpu_kernels.json" || true
