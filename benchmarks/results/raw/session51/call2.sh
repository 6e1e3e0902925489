#!/usr/bin/env bash
# Session 51, call 2 (nvidia-h200-x4): do the barrier grids still need their caps (64 programs, 512 warps) with the
# first-warp barrier? stall_probe at TP4, 16 MB, two-shot shapes 64x8192x8, 64x2048x8, 128x2048x8, 128x8192x16
# (1024 and 2048 warps), 12 rounds, first warp then every warp (TRITONCOMM_BARRIER_ALL_WARPS=1). Then the routed
# layout's stage stamps at EP4 (session 49's next-layout-stamps.sh, EP4 half).
# Prediction: every warp: 128-program shapes slow in some rounds (as on 2026-11-21: 5 of 12); first warp: none
# slow, and the 128x2048x8 shape 2-10% faster than 64x8192x8 (the old probe's "when not slow").
set -uo pipefail
source scripts/gpu_env.sh
P=benchmarks/experiments/stall_probe.py
echo "== first warp"; timeout 170 python3 $P --world 4 --bytes 16M --rounds 12 --json "$OUT/probe-first.json" 2>&1 | tail -9
echo "== every warp"; TRITONCOMM_BARRIER_ALL_WARPS=1 timeout 170 python3 $P --world 4 --bytes 16M --rounds 12 \
  --json "$OUT/probe-all.json" 2>&1 | tail -9
echo "== EP4 layout stamps, Qwen3-MoE 384"
timeout 150 python3 benchmarks/experiments/moe_trace.py --world 4 --tokens 384 --shape qwen3-moe \
  --json "$OUT/ep4-q.json" 2>&1 | grep -A 18 "rank 0:"
