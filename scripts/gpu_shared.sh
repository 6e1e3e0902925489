#!/usr/bin/env bash
# On a machine with fewer GPUs than ranks (one GPU, say): the GPU tests at world ${SHARED_WORLD:-2} with
# ranks sharing GPUs (LocalWorld(shared_gpus=True)). Their kernels are time-sliced: this checks
# correctness on real GPUs (compiled kernels, CUDA IPC, graphs), never speed. Logs go to $OUT.
# Usage: bash scripts/gpu_shared.sh [pytest arguments; default: tests]
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader | head -1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_SHARED_GPUS=1 TRITONCOMM_TEST_WORLDS=${SHARED_WORLD:-2} \
  timeout ${TEST_TIMEOUT:-500} python3 -m pytest -q -p no:cacheprovider -rfEs --maxfail=${MAXFAIL:-8} \
  "${@:-tests}" 2>&1 | tee "$OUT/gpu-shared-tests.log" | tail -${TAIL:-60}
