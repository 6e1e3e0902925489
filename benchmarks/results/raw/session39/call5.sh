#!/usr/bin/env bash
# Session 39, call 5 (4 GPUs), tree with the cache hints and the route kernel without its barrier: the MoE GPU
# tests at world 4 of the two-kernel paths, graph replay and stragglers; bench --op moe --world 4 at 128 / 512 /
# 4096 tokens per rank (both shapes, every row checked, the baselines in the run).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
nvidia-smi topo -m | head -6
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=4 timeout 120 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "two_kernel or cuda_graph or stragglers" 2>&1 | tee "$OUT/gpu-tests.log" | tail -2
timeout 330 python3 -m tritoncomm bench --op moe --world 4 --tokens 128,512,4096 --json "$OUT/moe-ep4.json" 2>&1 \
  | tee "$OUT/moe.log" | tail -20
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
