#!/usr/bin/env bash
# Session 45, call 8 (2 GPUs): the prefill send's 2048 columns for rows of up to 4096 elements (Qwen3-MoE), in the
# bench against the baselines: bench --op moe --world 2 --shapes qwen3-moe at 384 / 512 / 1024 / 4096 tokens per
# rank, every row checked; then the MoE GPU tests at world 2 whose instances take the prefill shape.
# Prediction (written before the call): 384 about 46.8 against (c)'s 45.7, 512 about 56.4 against 56.0, 1024 and
# 4096 0.5-2 µs faster than call 6 (93.2, 331.1).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
timeout 200 python3 -m tritoncomm bench --op moe --world 2 --shapes qwen3-moe --tokens 384,512,1024,4096 \
  --json "$OUT/moe-q.json" 2>&1 | tee "$OUT/moe.log" | grep -E " both |MoE|NO"
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py -k "two_kernel or direct or graph or stragglers or match_reference or slots_past" 2>&1 | tail -3
OUT=$(cd "$OUT" && pwd); (cd "$OUT" && tar czf json.tgz *.json && rm *.json)
