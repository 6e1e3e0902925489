#!/usr/bin/env bash
# Session 45, call 9 (2 GPUs): as call 8's bench, on the tree where FP8 dispatch keeps 4096 send columns.
# Prediction (written before the call): bf16 as in call 8 (47.3 / 56.4 / 91.4 / 330.5 µs at 384 / 512 / 1024 /
# 4096), FP8 back to call 6's (44.5 / 52.2 / 85.6 / 311.6).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
timeout 200 python3 -m tritoncomm bench --op moe --world 2 --shapes qwen3-moe --tokens 384,512,1024,4096 \
  --json "$OUT/moe-q.json" 2>&1 | tee "$OUT/moe.log" | grep -E " both |MoE|NO"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
