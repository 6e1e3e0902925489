#!/usr/bin/env bash
# Session 38, call 4 (2 GPUs): each item's first column block loaded before its slots are computed
# (send: the token's first block before its routing; layout: the received row's first block once its
# ids are known, before row_slots / copy_slots) against the tree before it (19c1e6b, unpacked in
# base_tree/), in turn, 2 rounds each; dispatch + combine in graphs. The new tree also with the
# routed send split into roles (routed_senders=-1).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8 --rounds 2"
for i in 1 2; do
  (cd base_tree && timeout 120 $M --shape deepseek-v3 --tokens 8,128,512,4096 --variants default \
    --json "$OUT/base-dsv3-$i.json" 2>&1 | tail -5 | sed "s/^/base $i: /")
  timeout 150 $M --shape deepseek-v3 --tokens 8,128,512,4096 --variants default,routed_senders=-1 \
    --json "$OUT/new-dsv3-$i.json" 2>&1 | tail -5 | sed "s/^/new $i: /"
done
(cd base_tree && timeout 100 $M --shape qwen3-moe --tokens 128,512,4096 --variants default \
  --json "$OUT/base-qwen.json" 2>&1 | tail -4 | sed "s/^/base qwen: /")
timeout 100 $M --shape qwen3-moe --tokens 128,512,4096 --variants default --json "$OUT/new-qwen.json" 2>&1 \
  | tail -4 | sed "s/^/new qwen: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
