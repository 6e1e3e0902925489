#!/usr/bin/env bash
# Session 35, call 7 (2 GPUs): calls with tokens_bound on instances sized for 4096 tokens launching
# their one-kernel dispatch and combine with the decode shape (132 programs of 4 warps; this tree)
# against the instance's prefill shape (264 of 8; 29ec7ff in _base), dispatch + combine in graphs
# at 1 / 8 / 64 tokens, one round each; then the MoE GPU tests of tokens_bound calls and bad input.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2 --tokens 1,8,64 --max-tokens 4096 --variants bound"
for i in 1; do
  for tree in base new; do
    P=$PYTHONPATH; [ $tree = base ] && P=_base:$PYTHONPATH
    PYTHONPATH=$P timeout 50 $M --json "$OUT/$tree-ds-$i.json" 2>&1 | tail -3 | sed "s/^/$tree ds $i: /"
    [ $i = 1 ] && PYTHONPATH=$P timeout 50 $M --shape qwen3-moe --json "$OUT/$tree-qwen.json" 2>&1 | tail -3 \
      | sed "s/^/$tree qwen: /"
  done
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf ab.tgz *.json && rm *.json)
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 100 python3 -m pytest -q -rs -p no:cacheprovider \
  tests/collectives/test_moe.py -k "large_instances or bad_input or role_split" 2>&1 | tee "$OUT/gpu-tests.log" | tail -5
