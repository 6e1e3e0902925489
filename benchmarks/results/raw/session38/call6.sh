#!/usr/bin/env bash
# Session 38, call 6 (2 GPUs): is the routed dispatch bound by the chain of loads before each row's
# data moves? Timing hacks (wrong slots, spread over the buffer; never checked, never landed):
# hackA/ computes each row's slots without the histogram loads (route.row_slots: the superblock and
# block sums), hackB without the window of ids either; against this tree (31624d3), in turn, 2 rounds
# each, dispatch + combine and dispatch alone, in graphs, 512 / 4096 tokens, both shapes.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8 --rounds 2 --tokens 512,4096 --variants default"
for shape in deepseek-v3 qwen3-moe; do
  for tree in . hackA hackB; do
    (cd $tree && timeout 60 $M --shape $shape --json "$OUT/$shape-$(basename $(pwd)).json" 2>&1 | tail -2 \
      | sed "s/^/$shape $tree both: /")
  done
  for tree in . hackA; do
    (cd $tree && timeout 60 $M --shape $shape --op dispatch --json "$OUT/d-$shape-$(basename $(pwd)).json" 2>&1 \
      | tail -2 | sed "s/^/$shape $tree dispatch: /")
  done
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
