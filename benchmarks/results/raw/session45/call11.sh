#!/usr/bin/env bash
# Session 45, call 11 (2 GPUs): the routed send's loads one column block ahead (MoEShape.routed_lookahead, off by
# default) against the default, in turn, 2 rounds, both phases.
# Prediction (written before the call): 1-1.5 µs less at 384 and 512 tokens (the programs with two rows wait one
# round less per row), even or worse at 4096 (session 38: Qwen3-MoE lost 16 µs with its first block early).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2 --rounds 2 --variants default,routed_lookahead=1"
timeout 100 $M --shape qwen3-moe --tokens 384,512,4096 --json "$OUT/q.json" 2>&1 | tail -4 | sed "s/^/q: /"
timeout 100 $M --shape deepseek-v3 --tokens 384,4096 --json "$OUT/ds.json" 2>&1 | tail -3 | sed "s/^/ds: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
