#!/usr/bin/env bash
# Session 44, call 7 (asked for nvidia-h200-x2, no needs_h200: H200s if they come, else H100s): the full EP2 table,
# bench --op moe --world 2 at 1 / 8 / 128 / 512 / 4096 tokens per rank, every row checked, the baselines in the run.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200' | tr '[:upper:]' '[:lower:]')
timeout 330 python3 -m tritoncomm bench --op moe --world 2 --json "$OUT/moe-$GPU-ep2.json" 2>&1 | tee "$OUT/moe.log" \
  | grep -E " both |MoE|NO"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
