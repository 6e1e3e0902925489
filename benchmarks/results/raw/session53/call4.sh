#!/usr/bin/env bash
# Session 53, call 4 (nvidia-h200-x4): call 3's EP4 bench (both shapes at 1024-4096) was cut at 300 s with nothing
# printed (its output buffered). Now 4096 tokens only, unbuffered, the baselines in the same run.
# Prediction: DeepSeek-V3 both phases about 1150 µs (session 51: 1171.7; (b) 1235.6), Qwen3-MoE about 706 (721.6).
set -uo pipefail
source scripts/gpu_env.sh
PYTHONUNBUFFERED=1 timeout 330 python3 -m tritoncomm bench --op moe --world 4 --shapes deepseek-v3,qwen3-moe \
  --tokens 4096 --json "$OUT/moe-ep4-4096.json" > "$OUT/moe-ep4-4096.log" 2>&1
echo "bench rc=$?"; tail -12 "$OUT/moe-ep4-4096.log"
