#!/usr/bin/env bash
# Session 50, call 6 (4 GPUs, lent at the end; about 4 device minutes left): the EP4 slow replays with the barrier's
# first-warp flags (the default since call 5) and with every warp (TRITONCOMM_BARRIER_ALL_WARPS=1), Qwen3-MoE at
# 384 tokens, ours only, 4 rounds of 20. Session 49 saw 7-20 slow samples of every 60-120 there.
# Prediction: 0 of 80 with the first warp; several with every warp.
set -uo pipefail
source scripts/gpu_env.sh
S="benchmarks/experiments/moe_stalls.py --world 4 --shape qwen3-moe --tokens 384 --rounds 4 --cases ours"
timeout 90 python3 $S --json "$OUT/ep4-first.json" 2>&1 | tail -2
TRITONCOMM_BARRIER_ALL_WARPS=1 timeout 90 python3 $S --json "$OUT/ep4-all.json" 2>&1 | tail -2
