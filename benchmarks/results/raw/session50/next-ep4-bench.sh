#!/usr/bin/env bash
# For a later 4-GPU call (written in session 50, not run: the device minutes were spent): the EP4 MoE bench with the
# first-warp barrier (docs/moe.md's EP4 H200 table predates it), both shapes, its default counts, every row checked;
# its footer counts slow replays of ours, (b) and (c). Then the layout stamps at EP4 (session 49's ready script).
# Prediction: no slow replays of ours; medians within 1-2 µs of the table's (at EP2 the fix moved them 0.4-1.1 µs).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
timeout 560 python3 -m tritoncomm bench --op moe --world 4 --json "$OUT/moe-h200-ep4.json" > "$OUT/moe.log" 2>&1
tail -45 "$OUT/moe.log"
