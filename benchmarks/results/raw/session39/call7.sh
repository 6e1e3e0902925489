#!/usr/bin/env bash
# Session 39, call 7 (2 GPUs): MoEShape.interleave (each routed send program lays out the first half of what
# each peer's counterpart sent it while it sends its own second half) against the default, in turn, 2 rounds,
# 512 / 4096 tokens, both shapes, both phases; its GPU tests first.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 90 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "interleave" 2>&1 | tee "$OUT/gpu-tests.log" | tail -2
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8 --rounds 2 --tokens 512,4096"
for shape in deepseek-v3 qwen3-moe; do
  timeout 80 $M --shape $shape --variants default,interleave=1 --json "$OUT/$shape.json" 2>&1 | tail -3 \
    | sed "s/^/$shape: /"
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
