#!/usr/bin/env bash
# Session 37, call 3 (4 GPUs): EP4 on the present tree. The MoE GPU tests at world 4 that check the
# results against the reference, graph replay with new routing and stragglers; then bench --op moe
# --world 4 (both shapes, 1 / 8 / 128 / 512 / 4096 tokens per rank, every row checked, the engine
# column, the baselines (a) (b) (c) in the same run).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=4 timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "match_reference or cuda_graph or stragglers or default_large" 2>&1 \
  | tee "$OUT/gpu-tests-w4.log" | tail -3
EP=4 PHASES=bench BENCH_TIMEOUT=400 bash scripts/gpu_moe.sh 2>&1 | tail -44
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
