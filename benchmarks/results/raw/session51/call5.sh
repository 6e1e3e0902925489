#!/usr/bin/env bash
# Session 51, call 5 (nvidia-h200-x2, warm after call 4): the combine's EP2 switch on H200s. Call 4: Qwen3-MoE 512
# tokens ran the latency mode (2.1 M partial elements, under THROUGHPUT_FROM_ELEMS_EP2 = 2.88 M) at 54.4 µs where
# the throughput mode took 52.6; DeepSeek-V3 384 (2.75 M, latency) 66.9 against 69.6. Both modes in turn near the
# switch, 2 rounds. Prediction: the throughput mode wins from 512 tokens per rank for both shapes and loses at 384.
set -uo pipefail
source scripts/gpu_env.sh
V="benchmarks/experiments/moe_variants.py --world 2 --rounds 2"
timeout 130 python3 $V --shape qwen3-moe --tokens 384,448,512 --variants mode=latency,mode=throughput 2>&1 | tail -4
timeout 130 python3 $V --shape deepseek-v3 --tokens 384,448,512 --variants mode=latency,mode=throughput 2>&1 | tail -4
