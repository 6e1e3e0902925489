#!/usr/bin/env bash
# Session 53, call 6 (nvidia-h200-x2): why the interleaved combine loses at EP2 (call 1: DeepSeek-V3 both phases
# 489.9 -> 518.1 µs at 4096 tokens). Stage stamps (moe_trace.py, rank 0, last call of a graph) at 4096 tokens per
# rank, DeepSeek-V3, the default and with combine_interleave_from=1; Qwen3-MoE, the default. No stamps of the
# combine on H200s were taken before.
# Prediction: default: combine pushed + barrier about 190 µs after its start, done about 55 after; interleaved: the
# pushes (with half the sums) take 30-50 µs longer than the default's, the rest about 25.
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
T="python3 benchmarks/experiments/moe_trace.py --world 2 --tokens 4096 --heap-gb 8"
timeout 100 $T --shape deepseek-v3 > "$OUT/trace-ds.log" 2>&1; echo "ds rc $?"
timeout 100 $T --shape deepseek-v3 --set combine_interleave_from=1 > "$OUT/trace-ds-ci.log" 2>&1; echo "ds-ci rc $?"
timeout 80 $T --shape qwen3-moe > "$OUT/trace-q.log" 2>&1; echo "q rc $?"
for f in "$OUT"/trace-*.log; do echo "== $f"; grep -A 14 "rank 0" "$f" | head -16 || tail -4 "$f"; done
