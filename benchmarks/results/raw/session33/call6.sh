#!/usr/bin/env bash
# Session 33, call 6 (2 GPUs): stage stamps inside the one-kernel dispatch and the combine at 1, 8
# and 128 tokens per rank (moe_trace.py), DeepSeek-V3, then Qwen3-MoE.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 150 python3 benchmarks/experiments/moe_trace.py --world 2 --tokens 1,8,128 --json "$OUT/trace-ds.json" 2>&1 \
  | tee "$OUT/trace-ds.log" | tail -80
timeout 90 python3 benchmarks/experiments/moe_trace.py --world 2 --tokens 8,128 --shape qwen3-moe \
  --json "$OUT/trace-qwen.json" 2>&1 | tee "$OUT/trace-qwen.log" | tail -2
