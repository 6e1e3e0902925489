#!/usr/bin/env bash
# Session 33, call 5 (2 GPUs): the problem counters' PCIe store only when they changed (this tree)
# against 894afec (git archive into _base, untracked), alternated twice, dispatch + combine at 1, 8
# and 128 tokens; the MoE bad-input GPU test; then bench --op moe (EP2, both shapes, the baselines).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2 --tokens 1,8,128 --variants default"
for i in 1 2; do
  for tree in base new; do
    P=$PYTHONPATH; [ $tree = base ] && P=_base:$PYTHONPATH
    PYTHONPATH=$P timeout 60 $M --json "$OUT/$tree-ds-$i.json" 2>&1 | tail -3 | sed "s/^/$tree ds $i: /"
  done
done
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 60 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "bad_input or full_experts" 2>&1 | tail -2
PHASES=bench BENCH_TIMEOUT=300 bash scripts/gpu_moe.sh
