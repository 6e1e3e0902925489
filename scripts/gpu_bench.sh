#!/usr/bin/env bash
# On a GPU machine: tune the selection tables at TP2 and TP4, then benchmark all-reduce, all-gather,
# reduce-scatter (and the primitives at TP2) with them. Usage: bash scripts/gpu_bench.sh [tune] [bench]
# TUNE_OPS / BENCH_OPS narrow the collectives (comma-separated); TABLE is the table tune writes (merged
# into it when it exists) and bench reads; TUNE_TIMEOUT / BENCH_TIMEOUT bound each step (seconds).
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
TABLE=${TABLE:-$OUT/table.json}
steps=${*:-tune bench}
rc=0
for step in $steps; do
  for w in $WORLDS; do
    case $step in
      tune)
        timeout "${TUNE_TIMEOUT:-400}" python3 -m tritoncomm tune --world "$w" \
          --op "${TUNE_OPS:-allreduce,allgather,reducescatter}" --out "$TABLE" >"$OUT/tune-tp$w.log" 2>&1 || rc=1
        grep -v '^tune ' "$OUT/tune-tp$w.log" | tail -80 ;;
      bench)
        ops=${BENCH_OPS:-allreduce,allgather,reducescatter}; [ "$w" = 2 ] && [ -z "${BENCH_OPS:-}" ] && ops=$ops,primitives
        timeout "${BENCH_TIMEOUT:-500}" python3 -m tritoncomm bench --op "$ops" --world "$w" --table "$TABLE" \
          --json "$OUT/bench-tp$w.json" --plot "$OUT/bench-tp$w.png" 2>&1 | tee "$OUT/bench-tp$w.log" || rc=1 ;;
    esac
  done
done
exit $rc
