#!/usr/bin/env bash
# Session 41, call 1 (2 GPUs): the combine at large calls. Both phases, in turn: default (throughput combine
# from 2048 tokens in all), block_h=4096, the latency combine with every program pushing then summing
# (mode=latency), and with the first 88 / 132 / 176 of 264 programs pushing and the others summing.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 20"
V=default,block_h=4096,mode=latency,mode=latency+push_programs=132,mode=latency+push_programs=88,mode=latency+push_programs=176
timeout 270 $M --rounds 3 --shape deepseek-v3 --tokens 128,512,2048,4096 --variants $V --json "$OUT/ds.json" 2>&1 \
  | tail -6 | sed "s/^/ds: /"
timeout 200 $M --rounds 3 --shape qwen3-moe --tokens 128,512,4096 --variants $V --json "$OUT/q.json" 2>&1 \
  | tail -5 | sed "s/^/q: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
