#!/usr/bin/env bash
# Session 49, call 2 (4 GPUs asked for, main 851f46e's kernels): where the routed dispatch spends its time at 384
# tokens per rank. Stage stamps (moe_trace.py) at EP4, Qwen3-MoE, bf16 and FP8 dispatch (the FP8 dispatch took
# 48.2 against 58.3 µs in the EP4 bench, (c) 45.4), then EP2 Qwen3-MoE (GPUs 0,1) beside EP2 DeepSeek-V3 (GPUs 2,3).
# Prediction: at EP4 the send's "rows sent" stage takes most of the dispatch and shrinks by about a third with FP8
# (half the link bytes); the layout after the barrier takes under a third.
set -uo pipefail
source scripts/gpu_env.sh
T=benchmarks/experiments/moe_trace.py
timeout 120 python3 $T --world 4 --tokens 384 --shape qwen3-moe --json "$OUT/ep4-q.json" > "$OUT/ep4-q.log" 2>&1
timeout 120 python3 $T --world 4 --tokens 384 --shape qwen3-moe --fp8 --json "$OUT/ep4-q-fp8.json" \
  > "$OUT/ep4-q-fp8.log" 2>&1
CUDA_VISIBLE_DEVICES=0,1 timeout 120 python3 $T --world 2 --tokens 384 --shape qwen3-moe --json "$OUT/ep2-q.json" \
  > "$OUT/ep2-q.log" 2>&1 &
CUDA_VISIBLE_DEVICES=2,3 timeout 120 python3 $T --world 2 --tokens 384 --shape deepseek-v3 --json "$OUT/ep2-ds.json" \
  > "$OUT/ep2-ds.log" 2>&1 &
wait
for f in ep4-q ep4-q-fp8 ep2-q ep2-ds; do echo "== $f"; grep -A 12 "rank 0:" "$OUT/$f.log" || tail -5 "$OUT/$f.log"; done
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
