#!/usr/bin/env bash
# Session 42, call 5 (2 GPUs): the MoE and EP GPU tests at world 2 on the final tree (every dealt variant at world 2).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 540 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py tests/integrations/test_ep.py 2>&1 | tee "$OUT/gpu-moe-tests.log" | tail -6
