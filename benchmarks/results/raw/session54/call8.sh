#!/usr/bin/env bash
# Session 54 call 8 (nvidia-h200-x4): GPU tests at worlds 2 and 4: the new test of the two-shot at the widest barrier
# grid the tune may pick (128 programs x 8 warps, eager then graph replays with fresh data), the graph-replay test
# of every algorithm, and test_world8's table checks. Prediction: all pass.
set -uo pipefail
source scripts/gpu_env.sh
TRITONCOMM_TEST_BACKEND=cuda timeout 170 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_allreduce.py -k "widest or graph_capture_and_replay" tests/collectives/test_world8.py 2>&1 \
  | tail -15 | tee "$OUT/gpu-tests.log"
