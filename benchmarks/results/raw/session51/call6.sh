#!/usr/bin/env bash
# Session 51, call 6 (nvidia-h200-x2): the combine's EP2 switch on H200s counted in tokens (throughput from 448 per
# rank, THROUGHPUT_FROM_TOKENS_EP2) on the working tree: the default (auto) against each mode forced, 2 rounds.
# Prediction: default equals the throughput mode at Qwen3-MoE 448-640 (1-4 µs under the latency mode at 512-640)
# and the latency mode at DeepSeek-V3 384.
set -uo pipefail
source scripts/gpu_env.sh
V="benchmarks/experiments/moe_variants.py --world 2 --rounds 2 --variants default,mode=latency,mode=throughput"
timeout 110 python3 $V --shape qwen3-moe --tokens 448,512,640 2>&1 | tail -4
timeout 70 python3 $V --shape deepseek-v3 --tokens 384 2>&1 | tail -2
