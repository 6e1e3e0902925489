#!/usr/bin/env bash
# Session 43, call 4 (2 GPUs): the whole GPU suite at world 2 (every failure, not only the first) with the engine
# capture test choosing its size from the engine's table (call 3 stopped there: at 4 MB the table sends TP2 to
# the Lamport one-shot, which writes no peer output).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 560 python3 -m pytest -q -p no:cacheprovider \
  --durations=15 2>&1 | tee "$OUT/gpu-tests.log" | tail -45
