#!/usr/bin/env bash
# Session 44, call 6 (2 GPUs): rows shared by column blocks where that evens the busiest program (shares.py's
# column_shares with more rows than programs) against the tree before it (old_tree/: git archive of 8e0352a's
# tritoncomm), in turn by shape, at 192 / 320 / 384 / 640 tokens per rank, both phases, 2 rounds; Qwen3-MoE also
# with send_block_h=2048 (a row of two send steps, which the split can share). Then bench --op moe on the new
# tree at 384 tokens: every row checked, (c) in the same run.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2 --rounds 2 --tokens 192,320,384,640"
for s in qwen3-moe deepseek-v3; do
  V=default; [ $s = qwen3-moe ] && V=default,send_block_h=2048
  for tree in old new; do
    P=.; [ $tree = old ] && P=$PWD/old_tree
    PYTHONPATH=$P timeout 100 $M --shape $s --variants $V --json "$OUT/$s-$tree.json" 2>&1 | tail -5 | sed "s/^/$s $tree: /"
  done
done
timeout 150 python3 -m tritoncomm bench --op moe --world 2 --tokens 384 --json "$OUT/moe-384.json" 2>&1 \
  | tee "$OUT/moe.log" | grep -E " both |MoE|NO"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
