#!/usr/bin/env bash
# Session 44, call 2 (2 GPUs): the GPU tests session 43 did not reach at world 2: test_moe.py from its 40th test
# (moe_rest.txt), the registry, reliability and world-8 tests.
set -uo pipefail
source scripts/gpu_env.sh
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 570 python3 -m pytest -q -p no:cacheprovider \
  --durations=15 $(cat benchmarks/results/raw/session44/moe_rest.txt) tests/collectives/test_registry.py \
  tests/collectives/test_reliability.py tests/collectives/test_world8.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -30
