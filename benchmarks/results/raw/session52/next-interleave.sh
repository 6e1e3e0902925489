#!/usr/bin/env bash
# For a later call (written in session 52, not run), on nvidia-h200-x4: where the interleaved send kernel
# (MoEShape.interleave_from; on by default for bf16 rows of more than 4096 elements at EP2 and EP4 on H200s from
# 2048 tokens per rank) was not measured: Qwen3-MoE at EP4 (it lost at EP2: both phases 297.9 -> 303.2 µs at 4096),
# the FP8 DeepSeek-V3 dispatch (rows of 7 KB) at EP2, and DeepSeek-V3 at EP4 below 2048 tokens (1024: the dispatch
# level, 162.6 -> 162.0). Both phases, in turn with the default, 2 rounds.
# Prediction: Qwen3-MoE EP4 level or slower at 2048-4096; FP8 DeepSeek-V3 within 2% at 2048-4096 (its layout moves
# half the bytes, so less to overlap); DeepSeek-V3 EP4 1024 level.
set -uo pipefail
source scripts/gpu_env.sh
V="benchmarks/experiments/moe_variants.py --rounds 2 --heap-gb 8"
timeout 120 python3 $V --world 4 --shape qwen3-moe --tokens 1024,2048,4096 --variants default,interleave_from=1 \
  2>&1 | tail -4
CUDA_VISIBLE_DEVICES=0,1 timeout 100 python3 $V --world 2 --shape deepseek-v3 --fp8 --tokens 2048,4096 \
  --variants default,interleave_from=1 2>&1 | tail -3
timeout 90 python3 $V --world 4 --shape deepseek-v3 --tokens 1024 --variants default,interleave_from=1 \
  2>&1 | tail -2
