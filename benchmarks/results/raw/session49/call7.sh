#!/usr/bin/env bash
# Session 49, call 7 (4 GPUs asked for, main): the stalls against the GPUs' clocks. Call 6: a sleep after each failed
# look leaves the stalls as long (about 80 ms a replay), so they are not the spins' pressure; their length follows
# the warps resident (call 5). Does the GPU slow its clocks then (power or thermal events)? nvidia-smi's clock
# event counters before and after, and dmon (power, clocks) each second, around moe_stalls at EP4 (Qwen3-MoE, 384
# tokens: ours and (c), 6 rounds).
# Prediction: no clock event covers them (the counters' power-cap time grows by under 0.1 s), pointing away from
# power management.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi -q -d PERFORMANCE > "$OUT/perf-before.txt" 2>&1
nvidia-smi dmon -s pc -d 1 > "$OUT/dmon.log" 2>&1 &
MON=$!
timeout 200 python3 benchmarks/experiments/moe_stalls.py --world 4 --shape qwen3-moe --tokens 384 --rounds 6 \
  --cases ours,tc --json "$OUT/clocks.json" 2>&1 | tail -2
kill $MON 2>/dev/null
nvidia-smi -q -d PERFORMANCE > "$OUT/perf-after.txt" 2>&1
diff "$OUT/perf-before.txt" "$OUT/perf-after.txt" | grep -v "^---" | head -40
sort -k3 -n "$OUT/dmon.log" | tail -3
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
