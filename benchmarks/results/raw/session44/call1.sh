#!/usr/bin/env bash
# Session 44, call 1 (2 GPUs): the dispatch path at 384-1024 tokens per rank. route_above=8192 sends these
# instances to the send + gather kernels (every send program holds the call's routing) instead of the route and
# send kernels; send_block_h=2048 halves the send's column step. Both phases in turn, 3 rounds, both shapes.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2"
V=default,route_above=8192,send_block_h=2048,route_above=8192+send_block_h=2048
timeout 280 $M --rounds 3 --shape qwen3-moe --tokens 384,512,1024 --variants $V --json "$OUT/q.json" 2>&1 \
  | tail -8 | sed "s/^/q: /"
timeout 280 $M --rounds 3 --shape deepseek-v3 --tokens 384,512,1024 --variants $V --json "$OUT/ds.json" 2>&1 \
  | tail -8 | sed "s/^/ds: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
