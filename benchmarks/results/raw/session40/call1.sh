#!/usr/bin/env bash
# Session 40, call 1 (2 GPUs), tree 3a35d71 (kernels of 73d26d2): every MoE and EP-layer GPU test at world 2,
# decode calls on routed instances included (the 73d26d2 mend's first GPU run).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvidia-smi topo -m | head -4
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 400 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py tests/integrations/test_ep.py --durations=8 2>&1 | tee "$OUT/gpu-tests.log" | tail -14
