#!/usr/bin/env bash
# Session 42, call 4 (the 4-GPU machine of call 3, two of its GPUs): bench --op moe at EP2 on the present kernels
# (lookahead on), 1 / 8 / 128 / 512 / 4096 tokens (every row checked, the baselines in the run): the full EP2 table.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200' | tr '[:upper:]' '[:lower:]')
timeout 560 python3 -m tritoncomm bench --op moe --world 2 --json "$OUT/moe-$GPU-ep2.json" 2>&1 | tee "$OUT/moe.log" \
  | grep -E " both |MoE"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
