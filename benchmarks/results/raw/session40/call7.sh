#!/usr/bin/env bash
# Session 40, call 7 (2 GPUs), the byte switch: the DeepSeek-V3 FP8 dispatch at 4096 tokens, both phases and the
# dispatch alone, 2 rounds, in turn: default (no direct rows for FP8 at 4096) against direct_from_bytes=0.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
M="python3 benchmarks/experiments/moe_variants.py --world 2 --heap-gb 8 --rounds 2 --fp8 --tokens 4096 --shape deepseek-v3"
timeout 100 $M --variants default,direct_from_bytes=0 --json "$OUT/ds-fp8.json" 2>&1 | tail -2 | sed "s/^/both: /"
timeout 80 $M --op dispatch --variants default,direct_from_bytes=0 --json "$OUT/ds-fp8-dispatch.json" 2>&1 | tail -2 \
  | sed "s/^/dispatch: /"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
