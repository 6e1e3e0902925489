#!/usr/bin/env bash
# On a GPU machine: the MoE dispatch/combine and EP layer tests on GPUs, then bench --op moe
# (EP2 on two or more GPUs; on one GPU, EP1: kernels and checks only, no links crossed), then the
# one-kernel dispatch against the two-kernel one at decode sizes (moe_variants.py).
# Logs and JSON go to $OUT (default: ./gpu-out). TOKENS and SHAPES narrow the benchmark.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
EP=$([ "$NGPU" -ge 2 ] && echo 2 || echo 1)
rc=0
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=$EP timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q \
  -p no:cacheprovider tests/collectives/test_moe.py tests/integrations/test_ep.py 2>&1 \
  | tee "$OUT/gpu-moe-tests.log" | tail -15 || rc=1
timeout ${BENCH_TIMEOUT:-400} python3 -m tritoncomm bench --op moe --world "$EP" ${TOKENS:+--tokens $TOKENS} \
  ${SHAPES:+--shapes $SHAPES} --json "$OUT/moe-h200-ep$EP.json" 2>&1 | tee "$OUT/moe.log" | tail -40 || rc=1
# the dispatch in one kernel against the send + gather kernels, decode sizes, interleaved
timeout ${VARIANTS_TIMEOUT:-200} python3 benchmarks/experiments/moe_variants.py --world "$EP" --tokens 1,8,64 \
  --variants default,two-kernel --json "$OUT/moe-variants.json" 2>&1 | tail -12 || rc=1
exit $rc
