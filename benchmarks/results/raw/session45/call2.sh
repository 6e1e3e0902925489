#!/usr/bin/env bash
# Session 45, call 2 (2 GPUs): route.row_slots with its histogram rows and window loaded in one round (three
# dependent rounds before) and the layout's counts in one load, against the tree before it (old_tree/: git
# archive of 7252817's tritoncomm), old and new alternating, 2 rounds each, both phases, at 384 / 512 / 4096
# tokens per rank. Then the routed dispatch's GPU tests at world 2.
# Prediction (written before the call): 384 tokens DeepSeek-V3 74.5 -> about 72, Qwen3-MoE 52 -> about 50; 512
# 2-3 µs less; 4096 10-15 µs less (the slots' loads cost about 23 µs there by session 38's timing hacks).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2 --rounds 1 --tokens 384,512,4096 --variants default"
for s in qwen3-moe deepseek-v3; do
  for rep in 1 2; do
    for tree in old new; do
      P=.; [ $tree = old ] && P=$PWD/old_tree
      PYTHONPATH=$P timeout 80 $M --shape $s --json "$OUT/$s-$tree-$rep.json" 2>&1 | tail -4 | sed "s/^/$s $tree $rep: /"
    done
  done
done
timeout 200 python3 -m pytest -q -x tests/collectives/test_moe.py -k "two_kernel or direct or slots_past or graph or stragglers" \
  2>&1 | tail -3
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
