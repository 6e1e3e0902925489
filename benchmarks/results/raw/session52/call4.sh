#!/usr/bin/env bash
# Session 52, call 4 (nvidia-h200-x2): the interleaved send kernel on by default for wide bf16 rows at EP2 on H200s
# from 2048 tokens per rank (INTERLEAVE_FROM_TOKENS_EP2). bench --op moe for DeepSeek-V3 at 1024-4096 tokens with
# the baselines in the same run, then the MoE GPU tests at world 2 for the time left.
# Prediction: DeepSeek-V3 dispatch about 120 / 231 µs at 2048 / 4096 (session 51's table: 127.2 / 244.6), both
# phases about 249 / 481 (253.4 / 491.4); 1024 unchanged (134.6); the FP8 column unchanged (not interleaved).
set -uo pipefail
source scripts/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
timeout 200 python3 -m tritoncomm bench --op moe --world 2 --shapes deepseek-v3 --tokens 1024,2048,4096 \
  --json "$OUT/moe-dsv3.json" > "$OUT/moe.log" 2>&1
echo "bench rc=$?"
TRITONCOMM_TEST_BACKEND=cuda TRITONCOMM_TEST_WORLDS=2 timeout 170 python3 -m pytest -q -p no:cacheprovider \
  tests/collectives/test_moe.py > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; tail -3 "$OUT/tests.log"
grep -E "tokens|deepseek|DeepSeek|slow" "$OUT/moe.log" | head -30
