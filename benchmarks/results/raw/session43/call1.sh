#!/usr/bin/env bash
# Session 43, call 1 (2 GPUs): the prefill shape's grid at 64-256 tokens per rank (more programs per SM, fewer
# warps), both phases in turn against the default, 3 rounds, DeepSeek-V3 and Qwen3-MoE.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2"
V=default,programs=396,programs=528,programs=528+num_warps=4,programs=396+num_warps=4,num_warps=4
timeout 270 $M --rounds 3 --shape deepseek-v3 --tokens 64,128,256 --variants $V --json "$OUT/ds.json" 2>&1 \
  | tail -9 | sed "s/^/ds: /"
timeout 240 $M --rounds 3 --shape qwen3-moe --tokens 128,256 --variants $V --json "$OUT/q.json" 2>&1 \
  | tail -9 | sed "s/^/q: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
