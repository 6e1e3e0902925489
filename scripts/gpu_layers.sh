#!/usr/bin/env bash
# On a GPU machine: the fused tensor-parallel benchmarks (fused norm, GEMM + all-reduce, decoder) at
# TP2 and at every GPU, plus the 2 x 2 hierarchical all-reduce on 4 GPUs. JSON per part and world in
# $OUT (default ./gpu-out). Usage: [WORLDS="2 4"] [PARTS=norm,gemm,decoder] bash scripts/gpu_layers.sh
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
rc=0
for w in $WORLDS; do
  parts=${PARTS:-norm,gemm,decoder}; [ "$w" = 4 ] && [ -z "${PARTS:-}" ] && parts=$parts,hier
  timeout ${LAYERS_TIMEOUT:-500} python3 -m tritoncomm layers --world "$w" --parts "$parts" \
    --json "$OUT/layers-tp$w-{part}.json" || rc=1
done
exit $rc
