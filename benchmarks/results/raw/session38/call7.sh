#!/usr/bin/env bash
# Session 38, call 7 (2 GPUs): cache hints on the MoE kernels' one-touch data (hackS/, call7/hackS.diff:
# the slot stores streaming, .cs; the token, received-row and expert-row loads evict-first) against this
# tree (31624d3's code), in turn; dispatch + combine and the dispatch alone, in graphs, 512 / 4096 tokens.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8 --rounds 2 --tokens 512,4096 --variants default"
for i in 1 2; do
  for tree in . hackS; do
    (cd $tree && timeout 60 $M --shape deepseek-v3 --json "$OUT/ds-$i-$(basename $(pwd)).json" 2>&1 | tail -2 \
      | sed "s/^/DS $i $tree both: /")
  done
done
for tree in . hackS; do
  (cd $tree && timeout 60 $M --shape qwen3-moe --json "$OUT/q-$(basename $(pwd)).json" 2>&1 | tail -2 \
    | sed "s/^/Q $tree both: /")
  (cd $tree && timeout 60 $M --shape deepseek-v3 --op dispatch --json "$OUT/d-$(basename $(pwd)).json" 2>&1 \
    | tail -2 | sed "s/^/DS $tree dispatch: /")
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
