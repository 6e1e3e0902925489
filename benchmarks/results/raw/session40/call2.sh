#!/usr/bin/env bash
# Session 40, call 2 (2 GPUs): MoEShape.direct_from (routed rows sent straight into their first kept slot on
# each peer, after the route kernel's barrier). Its GPU tests at world 2; then both phases at 512 / 4096 tokens,
# 3 rounds, in turn: default, route_barrier=1 (the barrier alone), direct_from=0 (the barrier and direct rows);
# the DeepSeek-V3 dispatch alone likewise.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "two_kernel or direct or decode_calls_on_large or dispatch_path or cuda_graph" \
  2>&1 | tee "$OUT/gpu-tests.log" | tail -3
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 10 --tokens 512,4096"
V=default,route_barrier=1,direct_from=0
for shape in deepseek-v3 qwen3-moe; do
  timeout 130 $M --rounds 3 --shape $shape --variants $V --json "$OUT/$shape.json" 2>&1 | tail -3 | sed "s/^/$shape: /"
done
timeout 80 $M --rounds 2 --shape deepseek-v3 --op dispatch --variants $V --json "$OUT/ds-dispatch.json" 2>&1 | tail -3 \
  | sed "s/^/ds dispatch: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
