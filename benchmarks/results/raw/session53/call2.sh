#!/usr/bin/env bash
# Session 53, call 2 (nvidia-h200-x4, warm after call 1): raw/session52/next-interleave.sh (where the interleaved
# send kernel was not measured: Qwen3-MoE at EP4, the FP8 DeepSeek-V3 dispatch at EP2, DeepSeek-V3 EP4 at 1024),
# then the interleaved combine for Qwen3-MoE at EP4 (call 1: DeepSeek-V3 EP4 level at 2048, 23.7 µs less at 4096).
# Prediction: Qwen3-MoE EP4 send interleave level or slower at 2048-4096; FP8 within 2%; DS EP4 1024 level;
# Qwen3-MoE EP4 interleaved combine level at 2048, 5-15 µs less at 4096.
set -uo pipefail
source scripts/gpu_env.sh
V="python3 benchmarks/experiments/moe_variants.py --rounds 2 --heap-gb 8"
timeout 120 $V --world 4 --shape qwen3-moe --tokens 1024,2048,4096 --variants default,interleave_from=1 \
  --json "$OUT/ep4-q-send.json" > "$OUT/ep4-q-send.log" 2>&1; echo "rc $?"
CUDA_VISIBLE_DEVICES=0,1 timeout 100 $V --world 2 --shape deepseek-v3 --fp8 --tokens 2048,4096 \
  --variants default,interleave_from=1 --json "$OUT/ep2-ds-fp8-send.json" > "$OUT/ep2-ds-fp8-send.log" 2>&1; echo "rc $?"
timeout 90 $V --world 4 --shape deepseek-v3 --tokens 1024 --variants default,interleave_from=1 \
  --json "$OUT/ep4-ds-1024-send.json" > "$OUT/ep4-ds-1024-send.log" 2>&1; echo "rc $?"
timeout 110 $V --world 4 --shape qwen3-moe --tokens 2048,4096 --variants default,combine_interleave_from=1 \
  --json "$OUT/ep4-q-comb.json" > "$OUT/ep4-q-comb.log" 2>&1; echo "rc $?"
for f in "$OUT"/*.log; do echo "== $f"; tail -4 "$f"; done
