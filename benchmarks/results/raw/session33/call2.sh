#!/usr/bin/env bash
# Session 33, call 2 (2 GPUs): launch-shape variants of dispatch + combine at 128 and 512 tokens per
# rank (DeepSeek-V3), dispatch alone beside them (combine = both - dispatch), and the one-kernel
# dispatch against the two-kernel one at 1, 8 and 128 tokens.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2"
VARS=default,block_h=2048,block_h=1024,num_warps=4,programs=132,programs=528+num_warps=4
timeout 200 $M --tokens 128,512 --variants $VARS --json "$OUT/var-shapes-both.json" 2>&1 | tail -4 | tee "$OUT/var-shapes-both.log"
timeout 150 $M --tokens 128,512 --variants $VARS --op dispatch --json "$OUT/var-shapes-dispatch.json" 2>&1 | tail -4 | tee "$OUT/var-shapes-dispatch.log"
timeout 120 $M --tokens 1,8,128 --variants default,two-kernel --json "$OUT/var-onekernel.json" 2>&1 | tail -5 | tee "$OUT/var-onekernel.log"
