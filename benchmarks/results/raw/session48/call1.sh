#!/usr/bin/env bash
# Session 48, call 1 (4 GPUs asked for, tree 349f147): which dispatch path wins at 128 and 256 tokens per rank at
# EP4 (the one-kernel dispatch, the default up to 2048 entries in the prefill shape, against the routed
# path: one_kernel_entries=1024 routes 256 tokens; +route_above=512 routes 128 too).
# Prediction (written before the call): at EP4 256 tokens the routed path is 10-20 µs faster for DeepSeek-V3
# (its 384-token dispatch, 79.5 µs, is 4 µs over the one-kernel one at 256); at 128 within 3 µs either way.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
nvidia-smi topo -m | head -6
V="benchmarks/experiments/moe_variants.py --rounds 2"
R="default,one_kernel_entries=1024,one_kernel_entries=512+route_above=512"
for s in deepseek-v3 qwen3-moe; do
  timeout 200 python3 $V --world 4 --tokens 128,256 --shape $s --variants $R --json "$OUT/ep4-path-$s.json" 2>&1 \
    | tail -5 | sed "s/^/ep4 path $s: /"
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
