#!/usr/bin/env bash
# Session 45, call 3 (2 GPUs, warm after call 2): the routed dispatch's GPU tests at world 2 on the new tree; then,
# to see call 2's failure, that test in the CPU world on the GPU image.
source scripts/gpu_env.sh; TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 400 python3 -m pytest -q -p no:cacheprovider tests/collectives/test_moe.py -k "two_kernel or direct or slots_past or graph or stragglers" 2>&1 | tail -25; timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/collectives/test_moe.py -k "3-hot-held" 2>&1 | grep -E "Error|error|assert|passed|failed" | head -20
