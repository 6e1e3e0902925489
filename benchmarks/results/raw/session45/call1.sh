#!/usr/bin/env bash
# Session 45, call 1 (2 GPUs): grids with at least one program per row at 384-512 tokens per rank (384 rows on
# 264 programs leave 120 programs two rows, the tail of session 44's stamps). Both phases in turn, 2 rounds.
# Prediction (written before the call): 396 programs of 8 warps take 384 tokens from 74.5 to about 70 (DeepSeek-V3)
# and 51.9 to about 48 (Qwen3-MoE), 512 within 2 µs either way; the 4-warp grids lose at both.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2"
V=default,programs=396,programs=384,programs=396+num_warps=4,programs=528+num_warps=4
timeout 270 $M --rounds 2 --shape qwen3-moe --tokens 384,512 --variants $V --json "$OUT/q.json" 2>&1 \
  | tail -6 | sed "s/^/q: /"
timeout 270 $M --rounds 2 --shape deepseek-v3 --tokens 384,512 --variants $V --json "$OUT/ds.json" 2>&1 \
  | tail -6 | sed "s/^/ds: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
