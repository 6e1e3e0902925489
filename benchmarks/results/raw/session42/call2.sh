#!/usr/bin/env bash
# Session 42, call 2 (2 GPUs): stage stamps of the default kernels (lookahead off) at 128 and 256 tokens (one-kernel
# dispatch, 131 of 264 programs sending: as the default 132, which the script cannot name), both shapes.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
T="python3 benchmarks/experiments/moe_trace.py --world 2"
timeout 120 $T --shape deepseek-v3 --tokens 128,256 --send-programs 131 --json "$OUT/ds.json" 2>&1 | tail -40
timeout 100 $T --shape qwen3-moe --tokens 128 --send-programs 131 --json "$OUT/q.json" 2>&1 | tail -20

OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
