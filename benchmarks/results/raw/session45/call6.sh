#!/usr/bin/env bash
# Session 45, call 6 (2 GPUs): bench --op moe --world 2 with its default counts (1, 8, 128, 256, 384, 512, 1024,
# 2048, 4096 tokens per rank; their first GPU run), every row checked, the baselines in the same run.
# Prediction (written before the call): about 250 s; DeepSeek-V3 at 384 level with (c) (about 69), Qwen3-MoE at 384
# still behind (about 48 against 46), at 512 level (about 57); the other rows as in session 44 or 1-7 µs faster
# from 384 up.
set -uo pipefail
PHASES=bench bash scripts/gpu_moe.sh
OUT=${OUT:-gpu-out}; OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
