#!/usr/bin/env bash
# Session 48, call 4 (4 GPUs asked for, tree cd28f2b): bench --op moe --world 4 at 1 / 8 / 128 / 256 / 384 / 512
# tokens per rank, the baselines in the same run.
# Prediction (written before the call): both phases as call 3 within 1 µs (DeepSeek-V3 13.0 / 16.9 / 57.6 / 98.4,
# Qwen3-MoE 12.0 / 14.6 / 41.5 / 69.4); (c) as in session 47 (17.2 / 59.3 / 97.8 and 15.9 / 41.4 / 63.9); 384 and
# 512 as session 47's (unchanged paths).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
timeout 520 python3 -m tritoncomm bench --op moe --world 4 --tokens 1,8,128,256,384,512 --json "$OUT/moe-ep4.json" \
  > "$OUT/moe.log" 2>&1; echo "bench rc $?"
tail -60 "$OUT/moe.log"
