#!/usr/bin/env bash
# Session 45, call 10 (2 GPUs): the stage stamps at 384 and 512 tokens per rank (Qwen3-MoE) on the new tree, as
# session 44's call 8 on the old one: where the remaining 1.2 µs to (c) at 384 lie. No prediction written.
set -uo pipefail
source scripts/gpu_env.sh
timeout 110 python3 benchmarks/experiments/moe_trace.py --world 2 --shape qwen3-moe --tokens 384,512 \
  --json "$OUT/q-trace.json" 2>&1 | tee "$OUT/trace.log" | tail -24
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
