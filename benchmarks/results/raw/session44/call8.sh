#!/usr/bin/env bash
# Session 44, call 8 (2 GPUs, the last device minutes): stage stamps of the routed dispatch and the combine at 384
# and 512 tokens per rank (Qwen3-MoE), for where the time goes at 384.
set -uo pipefail
source scripts/gpu_env.sh
timeout 110 python3 benchmarks/experiments/moe_trace.py --world 2 --shape qwen3-moe --tokens 384,512 \
  --json "$OUT/q-trace.json" 2>&1 | tee "$OUT/trace.log" | grep -E "tokens/rank|dispatch \[|combine \[|route \[|send \[" | head -40
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
