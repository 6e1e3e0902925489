#!/usr/bin/env bash
# Session 48, call 6 (4 GPUs asked for, tree a205450 + the CPU world's one sender, no GPU effect): is programs / world
# the best sender count at EP4? 8 tokens (132 programs: 33 by default) against 22 and 44; 128 tokens (264: 66) against
# 44 and 88; and the decode shape with 264 programs of 4 warps (66 senders) at 1 and 8 tokens. 2 rounds, both phases.
# Prediction (written before the call): 33 and 66 within 0.5 µs of the best; 264 decode programs lose at 1 token
# and gain under 1 µs at 8.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
V="benchmarks/experiments/moe_variants.py --rounds 2 --world 4"
for s in deepseek-v3 qwen3-moe; do
  timeout 90 python3 $V --tokens 1,8 --shape $s --variants default,send_programs=22,send_programs=44,programs=264 \
    --json "$OUT/ep4-decode-$s.json" 2>&1 | tail -3 | sed "s/^/ep4 decode $s: /"
  timeout 90 python3 $V --tokens 128 --shape $s --variants default,send_programs=44,send_programs=88 \
    --json "$OUT/ep4-128-$s.json" 2>&1 | tail -2 | sed "s/^/ep4 128 $s: /"
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
