#!/usr/bin/env bash
# Session 44, call 3 (2 GPUs): the rest session 43 did not reach: the PTX checks, the launcher, the tools' tests.
set -uo pipefail
source scripts/gpu_env.sh
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 400 python3 -m pytest -q -p no:cacheprovider \
  --durations=10 tests/kernels/test_ptx.py tests/test_launch.py tests/tools 2>&1 | tee "$OUT/gpu-tests.log" | tail -30
