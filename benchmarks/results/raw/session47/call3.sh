#!/usr/bin/env bash
# Session 47, call 3 (4 GPUs asked for): the decode dispatch and latency combine with the peers' items dealt to
# the programs as one sequence (new, working tree) against main b88ac2b (alt_tree/), and the one-kernel
# dispatch's small routing copies polled in one look. EP4 at 1 / 8 / 64 tokens, the GPU tests at world 4, then
# EP2 at 1 / 8.
# Prediction (written before the call): at EP4 both phases drop from about 16 / 19 µs to 11-13 / 14-16 at 1 / 8
# tokens (a program waits on one peer's row instead of three, in both kernels); 64 tokens 1-2 µs less; EP2 within
# 0.3 µs (one peer: nothing dealt). Tests pass.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
V="benchmarks/experiments/moe_variants.py --rounds 2 --variants default"
for s in deepseek-v3 qwen3-moe; do
  for tree in main new; do
    P=.; [ $tree = main ] && P=$PWD/alt_tree
    PYTHONPATH=$P timeout 70 python3 $V --world 4 --tokens 1,8,64 --shape $s --json "$OUT/ep4-$s-$tree.json" 2>&1 \
      | tail -4 | sed "s/^/ep4 $s $tree: /"
  done
done
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=4 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "match_reference or sending_and_layout or graph or sentinel or stragglers" \
  2>&1 | tail -3
for s in deepseek-v3 qwen3-moe; do
  for tree in main new; do
    P=.; [ $tree = main ] && P=$PWD/alt_tree
    CUDA_VISIBLE_DEVICES=0,1 PYTHONPATH=$P timeout 45 python3 $V --world 2 --tokens 1,8 --shape $s \
      --json "$OUT/ep2-$s-$tree.json" 2>&1 | tail -3 | sed "s/^/ep2 $s $tree: /"
  done
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
