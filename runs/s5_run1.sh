#!/usr/bin/env bash
# session 5, run 1: GPU tests of the changed code, then GEMM + AR sweep and decoder at TP4 and TP2
set -uo pipefail
source scripts/gpu_env.sh
t0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda timeout 190 python3 -m pytest -q -x -p no:cacheprovider tests/test_gemm.py tests/test_tp.py \
  tests/test_allreduce.py tests/test_graphs_fused.py -k "gemm or decode or capped or decoder" > $OUT/gpu-tests.log 2>&1
echo "tests rc=$? $(tail -1 $OUT/gpu-tests.log) t=$(( $(date +%s)-t0 ))"
for w in 4 2; do
  timeout 190 python3 -m tritoncomm layers --world $w --parts gemm,decoder --json "$OUT/layers-tp$w-{part}.json" > $OUT/layers-tp$w.log 2>&1
  echo "layers tp$w rc=$? t=$(( $(date +%s)-t0 ))"
done
tail -n 40 $OUT/gpu-tests.log | grep -E "FAIL|Error|passed|failed" | head
cat $OUT/layers-tp4.log $OUT/layers-tp2.log | grep -v "^\s*$" | tail -40
