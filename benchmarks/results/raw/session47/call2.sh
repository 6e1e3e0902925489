#!/usr/bin/env bash
# Session 47, call 2 (4 H200s, warm after call 1): bench --op moe --world 4 on main (b88ac2b), every default count,
# every row checked, the baselines in the run: the first EP4 table on H200s.
# Prediction (written before the call): every count beats (a); (c) beats us nowhere below 4096 tokens except
# perhaps DeepSeek-V3 at 128 (65 against 66 on H100s; (c) gains about 20% on H200s, we gain a few %); at 4096 tokens
# (b) wins by 5-15% (its HBM-bound parts gain on H200s, ours do not).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200' | tr '[:upper:]' '[:lower:]')
timeout 570 python3 -m tritoncomm bench --op moe --world 4 --json "$OUT/moe-$GPU-ep4.json" 2>&1 | tee "$OUT/moe.log" \
  | tail -24
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
