#!/usr/bin/env bash
# Session 35, call 5 (2 GPUs), tree 33a699a: tune --op moe for Qwen3-MoE at EP2 (the launch shape's
# switch prefill_from and the combine's throughput_from, with the role split on by default).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PHASES=tune SHAPES=qwen3-moe TUNE_TIMEOUT=330 bash scripts/gpu_moe.sh
