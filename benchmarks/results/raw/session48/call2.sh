#!/usr/bin/env bash
# Session 48, call 2 (4 GPUs asked for, tree 349f147): which dispatch path wins at 128 and 256 tokens per rank at
# EP4 and EP2 (the one-kernel dispatch, the default up to 2048 entries in the prefill shape, against the routed
# path: one_kernel_entries=1024 routes 256 tokens; +route_above=512 routes 128 too), then the decode role split
# at EP4 (send_programs / push_programs of 132), then stage stamps of the EP4 and EP2 decode combine at 8 tokens.
# Prediction (written before the call): at EP4 256 tokens the routed path is 10-20 µs faster for DeepSeek-V3
# (its 384-token dispatch, 79.5 µs, is 4 µs over the one-kernel one at 256); at 128 within 3 µs either way; at EP2
# the one-kernel path keeps 256 (as on H100s, 6-10 µs). The role split moves 1 and 8 tokens by under 1 µs.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
nvidia-smi topo -m | head -6
V="benchmarks/experiments/moe_variants.py --rounds 2"
R="default,one_kernel_entries=1024,one_kernel_entries=512+route_above=512"
for s in deepseek-v3 qwen3-moe; do
  CUDA_VISIBLE_DEVICES=0,1 timeout 150 python3 $V --world 2 --tokens 128,256 --shape $s --variants $R \
    --json "$OUT/ep2-path-$s.json" 2>&1 | tail -5 | sed "s/^/ep2 path $s: /"
done
S="default,send_programs=33,send_programs=99,push_programs=33,push_programs=99"
for s in deepseek-v3 qwen3-moe; do
  timeout 150 python3 $V --world 4 --tokens 1,8 --shape $s --variants $S --json "$OUT/ep4-roles-$s.json" 2>&1 \
    | tail -4 | sed "s/^/ep4 roles $s: /"
done
timeout 90 python3 benchmarks/experiments/moe_trace.py --world 4 --tokens 8 --push-programs 66 \
  --json "$OUT/trace-ep4.json" 2>&1 | tail -40 | sed "s/^/trace ep4: /"
CUDA_VISIBLE_DEVICES=0,1 timeout 60 python3 benchmarks/experiments/moe_trace.py --world 2 --tokens 8 --push-programs 66 \
  --json "$OUT/trace-ep2.json" 2>&1 | tail -40 | sed "s/^/trace ep2: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
