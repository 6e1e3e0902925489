#!/usr/bin/env bash
# Session 50, call 7 (4 GPUs, the last device minutes): the first-warp barrier where session 49 also saw stalls at
# EP4: DeepSeek-V3 at 512 tokens (the routed path, 2/60) and at 128 (the one-kernel dispatch, 2/60), 3 rounds.
# Prediction: 0 slow at 512; at 128 perhaps still some (the one-kernel dispatch's waits are packet polls and its
# routing copies' counter, not the barrier's flags).
set -uo pipefail
source scripts/gpu_env.sh
S="benchmarks/experiments/moe_stalls.py --world 4 --shape deepseek-v3 --rounds 3 --cases ours"
timeout 70 python3 $S --tokens 512 --json "$OUT/ep4-ds512-first.json" 2>&1 | tail -1
timeout 70 python3 $S --tokens 128 --json "$OUT/ep4-ds128-first.json" 2>&1 | tail -1
