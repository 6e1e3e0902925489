#!/usr/bin/env bash
# Session 53, call 5 (nvidia-h200-x4, warm after call 4, Triton's cache filled): call 4's bench at 1024 and 2048.
# Prediction: DeepSeek-V3 both phases about 590 µs at 2048 (session 51: 600.4), Qwen3-MoE about 364; 1024 as in
# session 51.
set -uo pipefail
source scripts/gpu_env.sh
PYTHONUNBUFFERED=1 timeout 300 python3 -m tritoncomm bench --op moe --world 4 --shapes deepseek-v3,qwen3-moe \
  --tokens 1024,2048 --json "$OUT/moe-ep4-1024-2048.json" > "$OUT/moe-ep4-1024-2048.log" 2>&1
echo "bench rc=$?"; tail -26 "$OUT/moe-ep4-1024-2048.log"
