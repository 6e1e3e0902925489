#!/usr/bin/env bash
# Triton 3.8 against 3.6 at TP2 (two GPUs of one host): the all-reduce table with every peer (FlashInfer where .peers
# is carried, vLLM's custom all-reduce, torch symm_mem, NCCL) and the fused add-RMSNorm (+FP8), in CUDA graphs, once
# per Triton, into $OUT/*-triton<version>.json; `compare` prints both side by side (speed on 3.8 over 3.6).
# The image's Triton is 3.6; 3.8 must be unpacked first into /tmp/triton-3.8.0 (../shared/tools/triton_to_device.sh,
# its chunks in back-to-back calls). One call per step, each within the 10-minute limit:
#   bash scripts/gpu_tritons.sh 3.6; bash scripts/gpu_tritons.sh 3.8; bash scripts/gpu_tritons.sh compare
# More steps, each its own call, on the Triton put first on the path (TRITON=3.8 for /tmp/triton-3.8.0):
#   costs (the call check on and off: all-reduce, fused norm, MoE), det (bench --op deterministic),
#   moe (bench --op moe at EP2, both dispatch shapes and the all-gather + reduce-scatter paths).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
rc=0
steps=${*:-3.6 3.8 compare}
for step in $steps; do
  case $step in
    compare)
      python3 - "$OUT" <<'PY' || rc=1
import json, sys
out = sys.argv[1]
def load(v):
    ar = json.load(open(f"{out}/allreduce-tp2-triton{v}.json"))["reports"][0]
    return {r["bytes"]: r["tritoncomm_us"] for r in ar["rows"]}, ar
a, b = load("3.6"), load("3.8")
print(f"TP2 all-reduce, {b[1]['device']}, torch {b[1]['torch']}: triton {a[1]['triton']} vs {b[1]['triton']}")
print(f"{'bytes':>10} {'3.6 us':>8} {'3.8 us':>8} {'3.6/3.8':>8}")
for n in sorted(set(a[0]) & set(b[0])):
    print(f"{n:>10} {a[0][n]:8.1f} {b[0][n]:8.1f} {a[0][n] / b[0][n]:8.2f}")
PY
      ;;
    3.6|3.8)
      if [ "$step" = 3.8 ]; then
        [ -f /tmp/triton-3.8.0/triton/__init__.py ] || { echo "no /tmp/triton-3.8.0: unpack its chunks first"; exit 1; }
        export PYTHONPATH=/tmp/triton-3.8.0:$PYTHONPATH
      fi
      python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
      timeout "${BENCH_TIMEOUT:-330}" python3 -m tritoncomm bench --op allreduce --world 2 \
        --json "$OUT/allreduce-tp2-triton$step.json" 2>&1 | tee "$OUT/allreduce-tp2-triton$step.log" | tail -30 || rc=1
      timeout "${LAYERS_TIMEOUT:-240}" python3 -m tritoncomm layers --world 2 --parts norm \
        --json "$OUT/layers-tp2-triton$step-{part}.json" 2>&1 | tail -25 || rc=1 ;;
    costs|det|moe)
      if [ "${TRITON:-}" = 3.8 ]; then export PYTHONPATH=/tmp/triton-3.8.0:$PYTHONPATH; fi
      v=$(python3 -c 'import triton; print(triton.__version__)')
      case $step in
        costs) args=(--op costs --sizes 8K,64K,1M,16M,64M --tokens 1,16,128,512,2048) ;;
        det) args=(--op deterministic) ;;
        moe) args=(--op moe) ;;
      esac
      timeout "${BENCH_TIMEOUT:-540}" python3 -m tritoncomm bench --world 2 "${args[@]}" \
        --json "$OUT/$step-tp2-triton$v.json" 2>&1 | grep -v -i warn | tail -30 || rc=1 ;;
    *) echo "gpu_tritons.sh: steps are 3.6, 3.8, compare, costs, det and moe, not $step"; exit 2 ;;
  esac
done
exit $rc
