#!/usr/bin/env bash
# On a GPU machine with two or more GPUs: the torch.distributed backend's GPU tests, its cost per call
# against the direct AllReduce and NCCL, and transformers' TP2 model with the backend and with NCCL.
# PHASES picks and orders them (default "tests bench model"): "tests bench" fit one device call of
# 10 minutes, "model" (two backends, eager then the static cache, which compiles) needs one of its own.
# Logs and JSON go to $OUT (default: ./gpu-out).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__,
"transformers", transformers.__version__)'
rc=0
for phase in ${PHASES:-tests bench model}; do
  case $phase in
    tests)
      TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q \
        -p no:cacheprovider tests/integrations/test_backend.py 2>&1 | tee "$OUT/gpu-backend-tests.log" | tail -15 \
        || rc=1 ;;
    bench)
      timeout 200 python3 -m tritoncomm bench --op backend --world 2 --json "$OUT/backend-h200-tp2.json" 2>&1 \
        | tee "$OUT/backend.log" | tail -10 || rc=1
      timeout 120 python3 benchmarks/experiments/backend_dispatch.py --world 2 --json "$OUT/backend-dispatch.json" \
        2>&1 | tee "$OUT/dispatch.log" | tail -40 || rc=1 ;;
    model)  # every rank prints its stacks every TRITONCOMM_BENCH_DUMP_S seconds (240): a stall shows where
      timeout ${MODEL_TIMEOUT:-560} python3 -m tritoncomm bench --op model --world 2 \
        --json "$OUT/model-h200-tp2.json" 2>&1 | tee "$OUT/model.log" | tail -30 || rc=1 ;;
    *) echo "gpu_backend.sh: unknown phase $phase" >&2; rc=1 ;;
  esac
done
exit $rc
