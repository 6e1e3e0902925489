#!/usr/bin/env bash
# Session 41, call 8 (2 GPUs): the MoE GPU tests of graph replay with new routing and of stragglers at world 2,
# now with the direct rows (routed-direct) among their paths.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 200 python3 -m pytest -q -p no:cacheprovider -rA \
  tests/collectives/test_moe.py -k "cuda_graph or stragglers" 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "PASS|FAIL|ERROR|passed|failed" | tail -16
