#!/usr/bin/env bash
# Session 40, call 5 (2 GPUs), the final kernels (direct rows from DIRECT_FROM_ELEMS on): the MoE GPU tests of
# the routed paths, direct rows, graph replay and stragglers at world 2; bench --op moe at EP2 (every row checked,
# the baselines in the run).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
git log --oneline -1 2>/dev/null || true
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "two_kernel or direct or dispatch_path or cuda_graph or stragglers" 2>&1 \
  | tee "$OUT/gpu-tests.log" | tail -2
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200' | tr '[:upper:]' '[:lower:]')
timeout 380 python3 -m tritoncomm bench --op moe --world 2 --json "$OUT/moe-$GPU-ep2.json" 2>&1 | tee "$OUT/moe.log" \
  | tail -24
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
