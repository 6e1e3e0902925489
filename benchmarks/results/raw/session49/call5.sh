#!/usr/bin/env bash
# Session 49, call 5 (4 GPUs asked for): the stalls of call 4 (about 80-160 ms in a replay of 32 calls, every rank
# alike, the hosts in step; ours only, with or without PDL, not (b) or (c)). Two more clues: which processes hold a
# context on each GPU during the run (nvidia-smi, twice a second), and whether the grid's residency matters: the
# default (264 programs of 8 warps, registers capped at 128 so that two fill an SM's register file exactly) against
# 132 programs (one per SM) and 264 of 4 warps (no cap needed). EP4, Qwen3-MoE, 384 tokens, 4 rounds of 20 samples.
# Prediction: each GPU shows one process; if the stalls come from programs not all resident, the two other grids
# have none (the default about 10 of 80).
set -uo pipefail
source scripts/gpu_env.sh
(for i in $(seq 1 400); do nvidia-smi --query-compute-apps=gpu_bus_id,pid,used_memory --format=csv,noheader; \
  sleep 0.5; done) > "$OUT/apps.log" 2>&1 &
MON=$!
timeout 300 python3 benchmarks/experiments/moe_stalls.py --world 4 --shape qwen3-moe --tokens 384 --rounds 4 \
  --cases ours,ours+programs=132,ours+num_warps=4,tc --json "$OUT/ep4-q384-grids.json" 2>&1 | tail -6
kill $MON 2>/dev/null
echo "contexts per GPU (distinct pids seen):"; sort -u "$OUT/apps.log" | awk -F, '{print $1}' | sort | uniq -c
sort -u "$OUT/apps.log" | head -12
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
