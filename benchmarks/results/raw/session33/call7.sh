#!/usr/bin/env bash
# Session 33, call 7 (2 GPUs): columns per step of the one-kernel dispatch on the prefill shape
# (one_block_h 1024, the packaged one, against 2048 and 4096) at 128 tokens per rank, both shapes.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2 --tokens 128 --variants default,one_block_h=2048,one_block_h=4096"
timeout 100 $M --json "$OUT/var-obh-ds.json" 2>&1 | tail -3 | tee "$OUT/var-obh-ds.log"
timeout 100 $M --shape qwen3-moe --json "$OUT/var-obh-qwen.json" 2>&1 | tail -3 | tee "$OUT/var-obh-qwen.log"
