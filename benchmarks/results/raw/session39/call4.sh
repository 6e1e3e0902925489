#!/usr/bin/env bash
# Session 39, call 4 (2 GPUs): MoEShape.own_early (the throughput combine's own tokens summed after its
# barrier, with the peers' partials, instead of before it and read back) at 0 / 4 / 6 / 8 sixteenths against
# the default (16: all before), in turn, 2 rounds, 2048 / 4096 tokens, both shapes, both phases; its GPU test.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 60 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "own_tokens_after_the_barrier" 2>&1 | tee "$OUT/gpu-tests.log" | tail -2
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8 --rounds 2 --tokens 2048,4096"
for shape in deepseek-v3 qwen3-moe; do
  timeout 130 $M --shape $shape --variants default,own_early=0,own_early=4,own_early=6,own_early=8 \
    --json "$OUT/$shape-own-early.json" 2>&1 | tail -3 | sed "s/^/$shape: /"
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
