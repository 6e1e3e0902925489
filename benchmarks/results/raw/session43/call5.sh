#!/usr/bin/env bash
# Session 43, call 5 (2 GPUs, the machine of call 4): the GPU suite's later directories at world 2 (call 4 ran
# out of time in tests/collectives after about 40% of the suite, with no failure).
set -uo pipefail
source scripts/gpu_env.sh
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 500 python3 -m pytest -q -p no:cacheprovider \
  --durations=10 tests/integrations tests/kernels tests/tools tests/test_launch.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -30
