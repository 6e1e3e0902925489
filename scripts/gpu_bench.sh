#!/usr/bin/env bash
# On a GPU machine: tune the selection tables at TP2 and TP4, then benchmark all-reduce, all-gather,
# reduce-scatter (and the primitives at TP2) with them. Usage: bash scripts/gpu_bench.sh [tune] [bench]
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
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
