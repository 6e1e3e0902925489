#!/usr/bin/env bash
# Session 48, call 3 (4 GPUs asked for): the working tree (one-kernel dispatch up to 1024 entries past two ranks;
# programs / world senders in the one-kernel dispatch) against main 349f147 (alt_tree/) at EP4, 1 / 8 / 64 / 128 /
# 256 tokens, one run per tree in turn, 2 rounds each; the GPU tests at world 4; at EP2 a quarter of the decode programs
# sending against half, and at EP4 every decode combine program pushing then summing (push_programs=0).
# Prediction (written before the call): EP4 8 tokens 1.5-2 µs less (call 2: 18.67 -> 16.90, 16.28 -> 14.45), 1
# token level, 64 and 128 tokens 0-2 µs less, 256 tokens 10-20 µs less; tests pass; at EP2 a quarter sending loses
# (the layout there has one peer's rows against this rank's one); push_programs=0 loses at 8 tokens.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
V="benchmarks/experiments/moe_variants.py --rounds 2 --variants default"
for s in deepseek-v3 qwen3-moe; do
  for tree in main new; do
    P=.; [ $tree = main ] && P=$PWD/alt_tree
    PYTHONPATH=$P timeout 100 python3 $V --world 4 --tokens 1,8,64,128,256 --shape $s \
      --json "$OUT/ep4-$s-$tree.json" 2>&1 | tail -6 | sed "s/^/ep4 $s $tree: /"
  done
done
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=4 timeout 220 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "match_reference or sending_and_layout or graph or sentinel or stragglers" \
  2>&1 | tail -3
for s in deepseek-v3 qwen3-moe; do
  CUDA_VISIBLE_DEVICES=0,1 timeout 60 python3 benchmarks/experiments/moe_variants.py --rounds 2 --world 2 --tokens 1,8 \
    --shape $s --variants default,send_programs=33,send_programs=44 --json "$OUT/ep2-senders-$s.json" 2>&1 \
    | tail -3 | sed "s/^/ep2 senders $s: /"
done
timeout 60 python3 benchmarks/experiments/moe_variants.py --rounds 2 --world 4 --tokens 8 --shape deepseek-v3 \
  --variants default,push_programs=0 --json "$OUT/ep4-push0.json" 2>&1 | tail -2 | sed "s/^/ep4 push0: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
