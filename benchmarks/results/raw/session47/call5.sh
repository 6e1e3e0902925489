#!/usr/bin/env bash
# Session 47, call 5 (4 GPUs asked for): the latency combine's sums with every peer's partial polled in each look
# (lamport_poll_sum; new, tree 8882447) against 2753145 (alt_tree/: dealt items, the peers polled in turn), EP4 at
# 1 / 8 / 64 tokens, 2 rounds; then the GPU tests at world 4 (MoE subset, and lamport_poll_sum's).
# Prediction (written before the call): 0.5-1.5 µs less at 1 and 8 tokens (two polls of data already there,
# each a round of loads and a CTA reduction, gone from every summing program); 64 tokens level or up to 1 µs
# worse (its 8-warp build at two programs per SM now spills, offline: 192 bytes at EP4).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
V="benchmarks/experiments/moe_variants.py --rounds 2 --variants default"
for s in deepseek-v3 qwen3-moe; do
  for tree in old new; do
    P=.; [ $tree = old ] && P=$PWD/alt_tree
    PYTHONPATH=$P timeout 60 python3 $V --world 4 --tokens 1,8,64 --shape $s --json "$OUT/ep4-$s-$tree.json" 2>&1 \
      | tail -4 | sed "s/^/ep4 $s $tree: /"
  done
done
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=4 timeout 150 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_lamport.py tests/collectives/test_moe.py -k "poll_sum or match_reference or graph or stragglers \
  or sentinel" 2>&1 | tail -3
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
