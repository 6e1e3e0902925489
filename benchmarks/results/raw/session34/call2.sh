#!/usr/bin/env bash
# Session 34, call 2 (2 GPUs): three trees, dispatch + combine at 1 / 8 / 128 tokens per rank
# (moe_variants, graphs), alternated: base (f9b2bb6, _base), v1 (+ a Lamport poll of a block with an
# element per thread returns its last look: no reload; _v1), new (v1 + the dispatch's first look at a
# row's columns issued before its weights are polled; this tree). Then this tree's MoE, EP, Lamport
# and Lamport all-reduce GPU tests.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2 --tokens 1,8,128 --variants default"
for i in 1 2; do
  for tree in base v1 new; do
    P=$PYTHONPATH; [ $tree = base ] && P=_base:$PYTHONPATH; [ $tree = v1 ] && P=_v1:$PYTHONPATH
    PYTHONPATH=$P timeout 45 $M --json "$OUT/$tree-ds-$i.json" 2>&1 | tail -3 | sed "s/^/$tree ds $i: /"
    [ $i = 1 ] && PYTHONPATH=$P timeout 45 $M --shape qwen3-moe --json "$OUT/$tree-qwen.json" 2>&1 | tail -3 \
      | sed "s/^/$tree qwen: /"
  done
done
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py tests/integrations/test_ep.py tests/kernels/test_lamport.py 2>&1 \
  | tee "$OUT/gpu-tests.log" | tail -4
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 90 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_allreduce.py -k "lamport or Lamport" 2>&1 | tee "$OUT/gpu-allreduce.log" | tail -3
