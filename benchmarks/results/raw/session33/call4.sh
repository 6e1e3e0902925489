#!/usr/bin/env bash
# Session 33, call 4 (2 GPUs): the one-kernel dispatch's count in the copy and joint polls (this tree)
# against the tree before them (git archive of 082d322 into _base, untracked), alternated
# twice, dispatch + combine at 1, 8 and 128 tokens per rank; then the MoE and Lamport GPU tests.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2 --tokens 1,8,128 --variants default"
for i in 1 2; do
  for tree in base new; do
    P=$PYTHONPATH; [ $tree = base ] && P=_base:$PYTHONPATH
    PYTHONPATH=$P timeout 60 $M --json "$OUT/$tree-ds-$i.json" 2>&1 | tail -3 | sed "s/^/$tree ds $i: /"
    PYTHONPATH=$P timeout 60 $M --shape qwen3-moe --json "$OUT/$tree-qwen-$i.json" 2>&1 | tail -3 | sed "s/^/$tree qwen $i: /"
  done
done
for tree in base new; do
  P=$PYTHONPATH; [ $tree = base ] && P=_base:$PYTHONPATH
  PYTHONPATH=$P timeout 60 $M --fp8 --json "$OUT/$tree-ds-fp8.json" 2>&1 | tail -3 | sed "s/^/$tree ds fp8: /"
done
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 240 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py tests/integrations/test_ep.py tests/kernels/test_lamport.py 2>&1 | tail -4
