#!/usr/bin/env bash
# Session 37, call 2 (2 GPUs): MoEShape.slot_chunk (the one-kernel dispatch's slots from running
# counts, N entries per histogram, instead of comparing each row with the whole routing copy) against
# the default (0: the comparison) at 1 / 8 / 128 / 256 tokens; at 384 / 512 tokens the one-kernel
# dispatch with 4096 entries and running counts against the route + send kernels (the default there).
# Dispatch + combine in graphs, 3 rounds, both shapes.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2"
for shape in deepseek-v3 qwen3-moe; do
  timeout 150 $M --shape $shape --tokens 1,8,128,256 --variants default,slot_chunk=256,slot_chunk=1024 \
    --json "$OUT/sc-$shape.json" 2>&1 | tail -5 | sed "s/^/$shape: /"
  timeout 150 $M --shape $shape --tokens 384,512 \
    --variants default,one_kernel_entries=4096+slot_chunk=256,one_kernel_entries=4096+slot_chunk=1024 \
    --json "$OUT/ok-$shape.json" 2>&1 | tail -3 | sed "s/^/$shape: /"
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
