#!/usr/bin/env bash
# Session 51, call 1 (nvidia-h200-x4): the EP4 MoE bench with the first-warp barrier (session 50's
# next-ep4-bench.sh): both shapes, the default counts, every row checked; the footer counts slow replays of ours,
# (b) and (c). Prediction: no slow replays of ours; medians within 1-2 µs of docs/moe.md's EP4 H200 table.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
timeout 560 python3 -m tritoncomm bench --op moe --world 4 --json "$OUT/moe-h200-ep4.json" > "$OUT/moe.log" 2>&1
echo "rc=$?"
tail -45 "$OUT/moe.log"
