#!/usr/bin/env bash
# On a GPU machine: the MoE dispatch/combine and EP layer tests on GPUs, then bench --op moe
# (EP2 on two or more GPUs; on one GPU, EP1: kernels and checks only, no links crossed), then the
# one-kernel dispatch (packets, and with a barrier) against the two-kernel one at decode sizes
# (moe_variants.py), then tune --op moe.
# PHASES picks and orders them (default "tests bench variants"; add "tune"): each phase fits one
# device call of 10 minutes on its own, the first three together may not.
# Logs and JSON go to $OUT (default: ./gpu-out). TOKENS and SHAPES narrow the benchmark and the tune.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
EP=${EP:-$([ "$NGPU" -ge 2 ] && echo 2 || echo 1)}  # EP=4 on four GPUs
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200|b200|a100' | head -1 \
  | tr '[:upper:]' '[:lower:]')
rc=0
for phase in ${PHASES:-tests bench variants}; do
  case $phase in
    tests)
      TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=$EP timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q \
        -p no:cacheprovider tests/collectives/test_moe*.py tests/integrations/test_ep.py 2>&1 \
        | tee "$OUT/gpu-moe-tests.log" | tail -15 || rc=1 ;;
    bench)
      timeout ${BENCH_TIMEOUT:-560} python3 -m tritoncomm bench --op moe --world "$EP" ${TOKENS:+--tokens $TOKENS} \
        ${SHAPES:+--shapes $SHAPES} --json "$OUT/moe-${GPU:-gpu}-ep$EP.json" 2>&1 | tee "$OUT/moe.log" | tail -40 || rc=1 ;;
    variants)  # the dispatch in one kernel (packets; barrier) against the send + gather kernels, decode sizes
      timeout ${VARIANTS_TIMEOUT:-200} python3 benchmarks/experiments/moe_variants.py --world "$EP" --tokens 1,8,64 \
        --variants default,packets=0,two-kernel --json "$OUT/moe-variants.json" 2>&1 | tail -12 || rc=1 ;;
    tune)
      timeout ${TUNE_TIMEOUT:-500} python3 -m tritoncomm tune --op moe --world "$EP" ${TOKENS:+--tokens $TOKENS} \
        ${SHAPES:+--shapes $SHAPES} --out "$OUT/moe-tune-${GPU:-gpu}-ep$EP.json" 2>&1 | tee "$OUT/moe-tune.log" | tail -30 || rc=1 ;;
    *) echo "gpu_moe.sh: unknown phase $phase" >&2; rc=1 ;;
  esac
done
exit $rc
