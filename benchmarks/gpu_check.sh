#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU (< 9 minutes on an H100): the GPU-marked tests, then the engine on
# CUDA at 1/16/64/256 sequences in bf16, triton backend vs torch backend: steps/s, ratio to the bandwidth roofline,
# host syncs per decode step, time to first audio. Writes benchmarks/results/gpu_check.json (docs/gpu.md).
#   bash benchmarks/gpu_check.sh [--steps N] [--concurrency 1,16,64,256] [--bandwidth-tbs 3.35]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
unset TRITON_INTERPRET
mkdir -p benchmarks/results
"$PYTHON" -c "import torch, triton; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__)"
JUNIT="$(mktemp --suffix=.xml)"
timeout 200 "$PYTHON" -m pytest -q -p no:cacheprovider -m "gpu or triton" --junitxml="$JUNIT" \
    tests/model/test_triton_kernels.py tests/engine/test_triton_backend.py tests/engine/test_device_sampler.py \
    tests/engine/test_sync.py tests/engine/test_warm_up.py tests/audio/test_gpu_decode.py || true
timeout 330 "$PYTHON" benchmarks/gpu_check.py --device cuda --model demo --tests "$JUNIT" "$@"
rm -f "$JUNIT"
