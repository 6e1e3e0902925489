#!/usr/bin/env bash
# Session 38, call 3 (2 GPUs): call 2 had more senders lose more (176 of 264 worse than 132); fewer
# senders in the routed send kernel's roles: 88 / 66 / 44 of 264, DeepSeek-V3 dispatch + combine in graphs at 512 / 4096
# tokens against the default, 3 rounds.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8"
timeout 170 $M --shape deepseek-v3 --tokens 512,4096 \
  --variants default,routed_senders=88,routed_senders=66,routed_senders=44 --json "$OUT/fewer.json" 2>&1 | tail -4
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
