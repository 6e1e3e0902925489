#!/usr/bin/env bash
# Session 39, call 3 (2 GPUs), tree with route_barrier off by default: the MoE GPU tests of the two-kernel
# paths, graph replay and stragglers; the route kernel's block sizes (super_blocks 4 / 8, block_e 32)
# against the default at 512 / 4096 tokens, both phases, 2 rounds; bench --op moe at EP2 (every row checked,
# the baselines in the run).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200' | tr '[:upper:]' '[:lower:]')
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 120 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "two_kernel or cuda_graph or stragglers" 2>&1 | tee "$OUT/gpu-tests.log" | tail -2
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8 --rounds 2 --tokens 512,4096"
for shape in deepseek-v3 qwen3-moe; do
  timeout 100 $M --shape $shape --variants default,super_blocks=4,super_blocks=8,block_e=32 \
    --json "$OUT/$shape-blocks.json" 2>&1 | tail -3 | sed "s/^/$shape: /"
done
timeout 330 python3 -m tritoncomm bench --op moe --world 2 --json "$OUT/moe-$GPU-ep2.json" 2>&1 | tee "$OUT/moe.log" \
  | tail -32
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
