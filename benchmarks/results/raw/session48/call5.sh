#!/usr/bin/env bash
# Session 48, call 5 (4 GPUs asked for, tree a205450 + the CPU world's one sender): where (c) still wins, the routed
# dispatch's column steps and the route kernel's barrier. EP4 Qwen3-MoE at 256 / 384 / 512 tokens; EP2 Qwen3-MoE
# at 384 / 1024 and DeepSeek-V3 at 384 / 512 (GPUs 0,1). 2 rounds, both phases.
# Prediction (written before the call): none of the variants gains more than 1 µs (each was measured on H100s at
# EP2 and kept as is); if one does, it is send_block_h=4096 for Qwen3-MoE at EP4 (rows to three peers per load).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
V="benchmarks/experiments/moe_variants.py --rounds 2"
timeout 200 python3 $V --world 4 --tokens 256,384,512 --shape qwen3-moe \
  --variants default,send_block_h=4096,send_block_h=1024,route_barrier=1 --json "$OUT/ep4-q.json" 2>&1 \
  | tail -4 | sed "s/^/ep4 q: /"
CUDA_VISIBLE_DEVICES=0,1 timeout 120 python3 $V --world 2 --tokens 384,1024 --shape qwen3-moe \
  --variants default,send_block_h=4096,send_block_h=1024,route_barrier=1 --json "$OUT/ep2-q.json" 2>&1 \
  | tail -3 | sed "s/^/ep2 q: /"
CUDA_VISIBLE_DEVICES=0,1 timeout 100 python3 $V --world 2 --tokens 384,512 --shape deepseek-v3 \
  --variants default,send_block_h=2048,route_barrier=1 --json "$OUT/ep2-ds.json" 2>&1 | tail -3 | sed "s/^/ep2 ds: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
