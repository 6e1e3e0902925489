#!/usr/bin/env bash
# Session 41, call 7 (4 GPUs), the final kernels (the combine's switch in elements): bench --op moe at EP4, 128 tokens (every row
# checked, the baselines in the run).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200' | tr '[:upper:]' '[:lower:]')
timeout 420 python3 -m tritoncomm bench --op moe --world 4 --tokens 128 --json "$OUT/moe-$GPU-ep4.json" 2>&1 | tee "$OUT/moe.log" \
  | tail -24
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
