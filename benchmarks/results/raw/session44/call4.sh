#!/usr/bin/env bash
# Session 44, call 4 (2 GPUs): at 384-1024 tokens per rank, 2048 send columns (call 1's gain) with the latency
# combine's role split (push_programs=88 or 132 of 264 programs push the peers' partials, the others sum this
# rank's tokens as they arrive), and the one-kernel dispatch up to 4096 entries. Both phases in turn, 3 rounds.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2"
S=send_block_h=2048
V=default,$S,$S+push_programs=88,$S+push_programs=132,one_kernel_entries=4096
timeout 280 $M --rounds 3 --shape qwen3-moe --tokens 384,512,1024 --variants $V --json "$OUT/q.json" 2>&1 \
  | tail -8 | sed "s/^/q: /"
timeout 280 $M --rounds 3 --shape deepseek-v3 --tokens 384,512,1024 --variants $V --json "$OUT/ds.json" 2>&1 \
  | tail -8 | sed "s/^/ds: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
