#!/usr/bin/env bash
# Session 39, call 1 (2 GPUs), tree e6d12ea (the cache hints; stage stamps in the route and send kernels):
# bench --op moe at EP2 (both shapes, 1 / 8 / 128 / 512 / 4096 tokens, every row checked, the baselines in
# the run); the routed stage stamps at 512 tokens (and the one-kernel ones at 128), both shapes; the
# one-kernel dispatch with its barrier (packets=0) against packets at 128 tokens.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200' | tr '[:upper:]' '[:lower:]')
timeout 330 python3 -m tritoncomm bench --op moe --world 2 --json "$OUT/moe-$GPU-ep2.json" 2>&1 | tee "$OUT/moe.log" \
  | tail -30
for shape in deepseek-v3 qwen3-moe; do
  timeout 60 python3 benchmarks/experiments/moe_trace.py --world 2 --shape $shape --tokens 128,512 \
    --json "$OUT/trace-$shape.json" 2>&1 | tee "$OUT/trace-$shape.log" | tail -28
done
timeout 60 python3 benchmarks/experiments/moe_variants.py --world 2 --tokens 128 --rounds 2 \
  --variants default,packets=0 --json "$OUT/variants-128.json" 2>&1 | tail -4
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
