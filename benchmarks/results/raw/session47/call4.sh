#!/usr/bin/env bash
# Session 47, call 4 (4 H200s, warm after call 3): bench --op moe --world 4 --tokens 1,8 on the dealt decode kernels
# (2753145), every row checked, the baselines in the run.
# Prediction (written before the call): both phases about 13 / 18.5 µs (DeepSeek-V3) and 12 / 16.5 (Qwen3-MoE) at
# 1 / 8 tokens, as in call 3; (c) about 14.5 / 17 and 14 / 16 as in call 2.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
timeout 300 python3 -m tritoncomm bench --op moe --world 4 --tokens 1,8 --json "$OUT/moe-h200-ep4-decode.json" 2>&1 \
  | tee "$OUT/moe.log" | grep -E " both |tokens"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
