#!/usr/bin/env bash
# Session 33, call 8 (2 GPUs): bench --op moe on the final tree (EP2, both shapes, the baselines,
# every row checked), then the combine's header (this tree) against the tree before it (_base, an
# untracked git archive of 2e0f080), one round each at 1 and 8 tokens per rank.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PHASES=bench BENCH_TIMEOUT=200 bash scripts/gpu_moe.sh
M="python3 benchmarks/experiments/moe_variants.py --world 2 --tokens 1,8 --variants default --rounds 2"
PYTHONPATH=_base:$PYTHONPATH timeout 30 $M --json "$OUT/base-ds.json" 2>&1 | tail -2 | sed "s/^/base: /"
timeout 30 $M --json "$OUT/new-ds.json" 2>&1 | tail -2 | sed "s/^/new: /"
