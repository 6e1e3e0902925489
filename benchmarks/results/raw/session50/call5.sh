#!/usr/bin/env bash
# Session 50, call 5 (2 GPUs): the barrier's first-warp flags as the default (tree after call 4; the old every-warp
# barrier behind TRITONCOMM_BARRIER_ALL_WARPS=1). (1) GPU tests at world 2: MoE and all-reduce (the host-counter test
# now waits for the device before it reads; it failed in call 4 on a race of its own, reading before the dispatch
# had ended). (2) In turn, the new default and the old barrier: bench --op allreduce,allgather,reducescatter at
# 64 KB / 1 MB / 16 MB, and bench --op moe at 384 tokens (both shapes; its rows count slow replays).
# Prediction: tests pass; every collective within 2% or faster with the first warp; MoE slow replays 0 with it.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 230 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py tests/collectives/test_allreduce.py 2>&1 | tail -4
for v in first all; do
  if [ $v = all ]; then export TRITONCOMM_BARRIER_ALL_WARPS=1; fi
  timeout 90 python3 -m tritoncomm bench --op allreduce,allgather,reducescatter --world 2 --sizes 65536,1048576,16777216 \
    --modes graph --json "$OUT/coll-$v-{op}.json" > "$OUT/coll-$v.log" 2>&1
  timeout 110 python3 -m tritoncomm bench --op moe --world 2 --tokens 384 --json "$OUT/moe-$v.json" > "$OUT/moe-$v.log" 2>&1
done
for v in first all; do echo "== $v"; tail -22 "$OUT/coll-$v.log"; tail -12 "$OUT/moe-$v.log"; done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
