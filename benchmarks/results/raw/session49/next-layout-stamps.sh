#!/usr/bin/env bash
# For a later 4-GPU call (written in session 49, not run): what the routed layout's 3.5 µs per row are. Stage
# stamps with the first peer item of each program stamped inside (route.ROUTED_STAGES 7-10: item started, its
# slot_of stored, its first column block stored, its last stores issued; the traced build spills 16 bytes at EP4
# offline). EP4 and EP2 (GPUs 0,1), Qwen3-MoE, 384 tokens (264 programs: no pairs).
# Prediction: from the item's start to its slots stored about 1.5 µs (the ids and the histogram loads), to its
# first block stored about 1 µs more, its stores issued 1 µs after that.
set -uo pipefail
source scripts/gpu_env.sh
T=benchmarks/experiments/moe_trace.py
timeout 150 python3 $T --world 4 --tokens 384 --shape qwen3-moe --json "$OUT/ep4-q.json" 2>&1 | grep -A 18 "rank 0:"
CUDA_VISIBLE_DEVICES=0,1 timeout 150 python3 $T --world 2 --tokens 384 --shape qwen3-moe --json "$OUT/ep2-q.json" 2>&1 \
  | grep -A 18 "rank 0:"
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
