#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU, at most 8 minutes on an H100/H200: the GPU- and Triton-marked tests
# on CUDA (<= 150 s), then benchmarks/gpu_check.py (<= 200 s): steady and end-to-end decode at 1/16/64/256
# sequences (256 at once), old vs new replay time, kernels per step, a seeded request alone vs among 63 others,
# near-greedy codes new vs old backend, 64 streaming clients; then benchmarks/profile_gpu_kernels.py (<= 120 s):
# device time per kernel, decode attention per split length, GEMM tiles x split-K targets (each part saved as it
# ends). Writes gpu_check.json and profile_gpu_kernels.json into $RESULTS (default benchmarks/results; docs/gpu.md).
#   bash benchmarks/gpu_check.sh [gpu_check.py options]      # python -m benchmarks.gpu_check --help
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
unset TRITON_INTERPRET
RESULTS="${RESULTS:-benchmarks/results}"
mkdir -p "$RESULTS"
"$PYTHON" -c "import torch, triton; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__)"
JUNIT="$(mktemp --suffix=.xml)"
timeout 150 "$PYTHON" -m pytest -q -p no:cacheprovider -m "gpu or triton" --junitxml="$JUNIT" \
    tests/model/test_triton_kernels.py tests/engine/test_triton_backend.py tests/engine/test_device_sampler.py \
    tests/engine/test_sync.py tests/engine/test_warm_up.py tests/audio/test_gpu_decode.py \
    tests/audio/test_chunk_plan.py tests/model/test_triton_layer_kernels.py tests/model/test_split_k.py || true
timeout 200 "$PYTHON" -m benchmarks.gpu_check --device cuda --model demo --tests "$JUNIT" \
    --out "$RESULTS/gpu_check.json" "$@" || true
rm -f "$JUNIT"
timeout 120 "$PYTHON" -m benchmarks.profile_gpu_kernels --out "$RESULTS/profile_gpu_kernels.json"
