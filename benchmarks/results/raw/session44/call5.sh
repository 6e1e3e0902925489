#!/usr/bin/env bash
# Session 44, call 5 (2 GPUs): bench --op moe at EP2 at the token counts between the table's (256 / 384 / 768 /
# 1024 / 2048 per rank), every row checked, the baselines in the run: is (c) faster anywhere else than at 512?
# Then send_block_h=2048 against the default at 2048 and 4096 tokens (both phases in turn, 2 rounds).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
timeout 330 python3 -m tritoncomm bench --op moe --world 2 --tokens 256,384,768,1024,2048 --json "$OUT/moe-between.json" \
  2>&1 | tee "$OUT/moe.log" | grep -E " both |MoE"
M="python3 benchmarks/experiments/moe_variants.py --world 2"
for s in qwen3-moe deepseek-v3; do
  timeout 130 $M --rounds 2 --shape $s --tokens 2048,4096 --variants default,send_block_h=2048 --json "$OUT/$s.json" \
    2>&1 | tail -3 | sed "s/^/$s: /"
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
