#!/usr/bin/env bash
# Session 36, call 5 (2 GPUs): could the one-kernel dispatch (packets, half the programs sending, no
# route kernel) take the 256- and 512-token instances, where our all-gather + reduce-scatter beats
# the route + send kernels? one_kernel_entries=4096 against the default (1024), dispatch + combine
# in graphs, 3 rounds.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2"
for shape in deepseek-v3 qwen3-moe; do
  timeout 200 $M --shape $shape --tokens 256,512 --variants default,one_kernel_entries=4096 \
    --json "$OUT/ok-$shape.json" 2>&1 | tail -3 | sed "s/^/$shape: /"
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
