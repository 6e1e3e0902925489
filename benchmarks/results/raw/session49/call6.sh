#!/usr/bin/env bash
# Session 49, call 6 (4 GPUs asked for; branch exp/spin-sleep: every bounded spin sleeps TRITONCOMM_SPIN_SLEEP_NS
# nanoseconds after a failed look, in signals.stop_waiting). Call 5: the stalls stay with one program per SM or
# four warps (16 of 80 samples each) but shrink with them (about 48 and 44 ms a replay, against 77 by default), as if
# they lasted a number of spins: the pollers' pressure, not the residency. So: the same samples with each failed
# look followed by a sleep of 0, 50 or 200 ns. EP4, Qwen3-MoE, 384 and 8 tokens (the decode's cost of the sleep),
# and (c).
# Prediction: with a sleep the stalls are gone (0 of 80) or much shorter; 384 tokens within 1 µs; 8 tokens up to
# 0.5 µs slower at 200 ns.
set -uo pipefail
source scripts/gpu_env.sh
for ns in 0 50 200; do
  echo "== sleep $ns ns"
  TRITONCOMM_SPIN_SLEEP_NS=$ns timeout 170 python3 benchmarks/experiments/moe_stalls.py --world 4 --shape qwen3-moe \
    --tokens 384 --rounds 4 --cases ours,ours@8,tc --json "$OUT/sleep$ns.json" 2>&1 | tail -3
done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
