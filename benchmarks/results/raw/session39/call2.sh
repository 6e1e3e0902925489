#!/usr/bin/env bash
# Session 39, call 2 (2 GPUs): the route kernel without its barrier (MoEShape.route_barrier=False: the send
# kernel's barrier covers the routing) against the default, in turn, 3 rounds, 512 / 4096 tokens, both
# shapes, both phases and the dispatch alone; its GPU tests (the two-kernel paths against the reference).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "two_kernel_dispatch_matches_reference" 2>&1 | tee "$OUT/gpu-tests.log" | tail -2
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8 --rounds 3 --tokens 512,4096"
for shape in deepseek-v3 qwen3-moe; do
  for op in both dispatch; do
    timeout 90 $M --shape $shape --op $op --variants default,route_barrier=0 --json "$OUT/$shape-$op.json" 2>&1 \
      | tail -3 | sed "s/^/$shape $op: /"
  done
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
