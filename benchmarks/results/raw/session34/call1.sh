#!/usr/bin/env bash
# Session 34, call 1 (2 GPUs): main + the two changes reverted in session 33 (2048 columns per
# one-kernel step on the prefill shape, the combine's header), without the joint wait: the MoE and EP
# GPU tests, bench --op moe (EP2, both shapes, the baselines, every row checked), then this tree
# against main (_base, an untracked git archive of e2b585e), one round each at 1 / 8 / 128 tokens.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PHASES="tests bench" TEST_TIMEOUT=170 BENCH_TIMEOUT=280 bash scripts/gpu_moe.sh
M="python3 benchmarks/experiments/moe_variants.py --world 2 --tokens 1,8,128 --variants default"
for tree in base new; do
  P=$PYTHONPATH; [ $tree = base ] && P=_base:$PYTHONPATH
  PYTHONPATH=$P timeout 45 $M --json "$OUT/$tree-ds.json" 2>&1 | tail -4 | sed "s/^/$tree: /"
done
