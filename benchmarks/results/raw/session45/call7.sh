#!/usr/bin/env bash
# Session 45, call 7 (2 GPUs): the knobs of session 44 again at 384 and 512 tokens per rank on the new tree (row
# slots in one round, the latency combine's sums reversed), both phases, in turn, 3 rounds.
# Prediction (written before the call): none closes Qwen3-MoE's gap to (c) at 384 (45.7): send_block_h=2048 about
# 0.8 µs faster, the push split no better than the reversed sums, 396 programs of 4 warps 2-3 faster at 384 and
# slower at 512, the one-kernel dispatch slower.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2 --rounds 3 --tokens 384,512"
V=default,send_block_h=2048,push_programs=132,send_block_h=2048+push_programs=132,programs=396+num_warps=4,one_kernel_entries=4096
timeout 200 $M --shape qwen3-moe --variants $V --json "$OUT/q.json" 2>&1 | tail -4 | sed "s/^/q: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
