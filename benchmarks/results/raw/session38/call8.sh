#!/usr/bin/env bash
# Session 38, call 8 (2 GPUs): tree with the cache hints (streaming slot stores, evict-first one-touch
# loads). The MoE GPU tests of graph replay and stragglers; dispatch + combine in graphs at 1 / 8 /
# 128 / 512 / 4096 tokens, both shapes, against 31624d3 (the same kernels without the hints, in
# base_tree/), in turn, 2 rounds each; bench --op moe at 512 / 4096 tokens (the baselines in the run).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 80 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "cuda_graph or stragglers" 2>&1 | tee "$OUT/gpu-tests.log" | tail -2
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8 --rounds 2 --tokens 1,8,128,512,4096"
for shape in deepseek-v3 qwen3-moe; do
  (cd base_tree && timeout 60 $M --shape $shape --variants default --json "$OUT/base-$shape.json" 2>&1 | tail -5 \
    | sed "s/^/base $shape: /")
  timeout 60 $M --shape $shape --variants default --json "$OUT/new-$shape.json" 2>&1 | tail -5 | sed "s/^/new $shape: /"
done
timeout 130 python3 -m tritoncomm bench --op moe --world 2 --tokens 512,4096 --json "$OUT/moe-ep2-512-4096.json" \
  2>&1 | tee "$OUT/moe.log" | tail -12
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
