#!/usr/bin/env bash
# On a GPU machine: tune the selection tables at TP2 and TP4, then benchmark all-reduce, all-gather,
# reduce-scatter (and the primitives at TP2) with them. Usage: bash scripts/gpu_bench.sh [tune] [bench]
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())')
WORLDS=${WORLDS:-$(printf '%s\n' 2 "$NGPU" | sort -nu | tr '\n' ' ')}
TABLE=${TABLE:-$OUT/table.json}
steps=${*:-tune bench}
rc=0
for step in $steps; do
  for w in $WORLDS; do
    case $step in
      tune) timeout 400 python3 -m tritoncomm tune --world "$w" --out "$TABLE" || rc=1 ;;
      bench)
        ops=allreduce,allgather,reducescatter; [ "$w" = 2 ] && ops=$ops,primitives
        timeout 500 python3 -m tritoncomm bench --op $ops --world "$w" --table "$TABLE" \
          --json "$OUT/bench-tp$w.json" --plot "$OUT/bench-tp$w.png" || rc=1 ;;
    esac
  done
done
exit $rc
